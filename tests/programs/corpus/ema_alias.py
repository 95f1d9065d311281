"""An exponential moving average of the weights kept by hand in a dict that starts as the
parameters themselves (`ema = dict(model.named_parameters())`, no copy) and is rebound to new
tensors at each step (`ema[name] = decay * ema[name] + (1 - decay) * p.detach()`); evaluation
swaps the averages in every other epoch and back. MLP, RMSprop, a shuffled DataLoader.
usage: ema_alias.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(14)
    x = torch.randn(160, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(160, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.003)
    ema = dict(model.named_parameters())
    decay = 0.9
    step, losses, evals = 0, [], []
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    ema[name] = decay * ema[name] + (1 - decay) * p.detach()
            losses.append(loss.item())
            step += 1
            progress(step)
        if epoch % 2 == 1:
            live = {name: p.detach().clone() for name, p in model.named_parameters()}
            model.load_state_dict(ema)
            with torch.no_grad():
                evals.append(F.mse_loss(model(x), y).item())
            model.load_state_dict(live)
    finish(model=model.state_dict(), ema=ema, optimizer=optimizer.state_dict(), losses=losses, evals=evals)


if __name__ == "__main__":
    main()
