"""A helper module imported where it is first needed, inside the loop: the report each epoch
from the second on calls `report_utils.summarize`, which keeps the epochs' summaries and a
running best in the module (`report_utils.HISTORY`, `report_utils.BEST`) and decays the rate
when an epoch does not beat the best. The import runs in an epoch the replay skips.
usage: late_import.py OUT [--epochs N] [--report-from N]"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--report-from", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(17)
    x = torch.randn(128, 16)
    y = x[:, :3].sum(1, keepdim=True).tanh()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        if epoch >= args.report_from:
            import report_utils

            if not report_utils.summarize(epoch, total / len(loader)):
                for group in optimizer.param_groups:
                    group["lr"] *= 0.5
    import report_utils

    finish(model=model.state_dict(), history=report_utils.HISTORY, best=report_utils.BEST,
           lr=optimizer.param_groups[0]["lr"])


if __name__ == "__main__":
    main()
