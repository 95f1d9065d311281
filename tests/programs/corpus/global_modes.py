"""Process-wide settings changed at a phase change, outside any object the program holds: from
--phase-epoch on, torch's intra-op threads doubled once the data is in memory (`threads`; the
program reports them with its final state), a scale read from an environment variable the
script sets then, as configuration passed to library code through the environment is
(`environ`), or the default dtype raised to float64 for the noise each step adds
(`default_dtype`).
usage: global_modes.py OUT MODE [--epochs N] [--phase-epoch N]"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def noise_scale():
    return float(os.environ.get("NOISE_SCALE", "0.01"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["threads", "environ", "default_dtype"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--phase-epoch", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(15)
    x = torch.randn(192, 64)
    y = torch.sin(x[:, :4].sum(1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    step, losses = 0, []
    for epoch in range(args.epochs):
        if epoch == args.phase_epoch:
            if args.mode == "threads":
                torch.set_num_threads(2 * torch.get_num_threads())
            elif args.mode == "environ":
                os.environ["NOISE_SCALE"] = "0.05"
            else:
                torch.set_default_dtype(torch.float64)
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_((noise_scale() * torch.randn(p.shape)).to(p.dtype))
            losses.append(loss.item())
            step += 1
            progress(step)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses,
           threads=torch.get_num_threads(), dtype=str(torch.get_default_dtype()))


if __name__ == "__main__":
    main()
