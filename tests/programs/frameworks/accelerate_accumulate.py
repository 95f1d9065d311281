"""An Accelerate loop as its guides write one: `accelerator.accumulate(model)` around each
micro-batch (gradients synchronised and the optimizer stepped every 3), a warmup schedule from
`transformers.get_scheduler`-style LambdaLR, `accelerator.clip_grad_norm_` when gradients sync,
and an evaluation after each epoch through `gather_for_metrics`.
usage: accelerate_accumulate.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    set_seed(21)
    x, y = torch.randn(144, 10), torch.randint(3, (144,))
    train = DataLoader(TensorDataset(x[:120], y[:120]), batch_size=8, shuffle=True)
    evaluate = DataLoader(TensorDataset(x[120:], y[120:]), batch_size=8)
    model = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.GELU(), torch.nn.Linear(24, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    total = args.epochs * len(train) // 3
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4) * max(0.0, 1 - s / total))
    model, optimizer, train, evaluate, scheduler = accelerator.prepare(model, optimizer, train, evaluate, scheduler)
    history, step = [], 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in train:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(xb), yb)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            step += 1
            progress(step)
        model.eval()
        correct = 0
        for xb, yb in evaluate:
            with torch.no_grad():
                preds = model(xb).argmax(-1)
            preds, yb = accelerator.gather_for_metrics((preds, yb))
            correct += (preds == yb).sum().item()
        history.append((epoch, loss.item(), correct))
        accelerator.print(f"epoch {epoch}: {correct} of 24")
    finish(model=accelerator.unwrap_model(model).state_dict(), optimizer=optimizer.state_dict(), history=history)


if __name__ == "__main__":
    main()
