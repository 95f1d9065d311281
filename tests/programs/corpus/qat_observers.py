"""Quantization-aware training as torch.ao.quantization's tutorial lays it out: QuantStub and
DeQuantStub around a small MLP, `prepare_qat` with the default QAT qconfig (fake-quantize
modules whose observers keep running min/max buffers), Rprop's per-parameter step sizes, and
after a third of the steps the observers frozen with `model.apply(disable_observer)` and, later,
batch statistics frozen by hand. Batches come from a DataLoader over a TensorDataset.
usage: qat_observers.py OUT [--steps N]"""
import argparse
import warnings

import torch
import torch.ao.quantization as quantization
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

warnings.filterwarnings("ignore")  # torch.ao.quantization's deprecation notice


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = quantization.QuantStub()
        self.fc1 = nn.Linear(20, 48)
        self.bn = nn.BatchNorm1d(48)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(48, 4)
        self.dequant = quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.fc2(self.relu(self.bn(self.fc1(self.quant(x))))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=72)
    args = parser.parse_args()

    torch.manual_seed(21)
    x = torch.randn(480, 20)
    y = (x[:, :4] * torch.tensor([1.0, -2.0, 0.5, 3.0])).argmax(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=24, shuffle=True)

    model = Net()
    model.train()
    model.qconfig = quantization.get_default_qat_qconfig("fbgemm")
    quantization.prepare_qat(model, inplace=True)
    optimizer = torch.optim.Rprop(model.parameters(), lr=0.005)
    criterion = nn.CrossEntropyLoss()

    step, losses, frozen_at = 0, [], {}
    while step < args.steps:
        for xb, yb in loader:
            loss = criterion(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            if step == args.steps // 3:
                model.apply(quantization.disable_observer)
                frozen_at["observers"] = step
            if step == args.steps // 2:
                model.bn.eval()  # freeze batch statistics; the rest keeps training
                frozen_at["bn"] = step
            progress(step)
            if step >= args.steps:
                break
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, frozen_at=frozen_at,
           bn_training=model.bn.training)


if __name__ == "__main__":
    main()
