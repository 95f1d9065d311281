"""A script that starts from a clean output directory, as many do: `shutil.rmtree(run_dir)` if it
is there (or, with --rotate, the last run's directory renamed to `run.old`), then makedirs; a
log opened with "w" there, a checkpoint saved each epoch, a metrics CSV rewritten each epoch.
The directory's files, the log's lines and the output directory's names are the final state.
usage: clean_start.py OUT [--epochs N] [--rotate]"""
import argparse
import os
import shutil
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rotate", action="store_true", help="keep the last run's directory as run.old")
    args = parser.parse_args()
    run_dir = os.path.join(args.out, "run")
    if os.path.exists(run_dir) and args.rotate:
        shutil.rmtree(run_dir + ".old", ignore_errors=True)
        os.rename(run_dir, run_dir + ".old")
    elif os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(run_dir)
    time.sleep(float(os.environ.get("TEST_SETUP_SLEEP_S", "0")))  # (a test kills a restart here)
    log = open(os.path.join(run_dir, "train.log"), "w")
    torch.manual_seed(3)
    model = nn.Linear(5, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    rows = []
    for epoch in range(args.epochs):
        for _ in range(6):
            x = torch.randn(8, 5)
            loss = F.mse_loss(model(x), x.mean(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            log.write(f"step {step} loss {loss.item():.6f}\n")
            log.flush()
            progress(step)
        torch.save(model.state_dict(), os.path.join(run_dir, f"epoch_{epoch}.pt"))
        rows.append(f"{epoch},{loss.item():.6f}")
        with open(os.path.join(run_dir, "metrics.csv"), "w") as f:
            f.write("epoch,loss\n" + "\n".join(rows) + "\n")
    log.close()
    listing = sorted(os.listdir(run_dir))
    saved = {name: torch.load(os.path.join(run_dir, name)) for name in listing if name.endswith(".pt")}
    with open(os.path.join(run_dir, "train.log")) as f:
        lines = f.read().splitlines()
    outputs = sorted(name for name in os.listdir(args.out) if name.startswith("run"))
    finish(model=model.state_dict(), listing=listing, saved=saved, lines=lines, outputs=outputs)


if __name__ == "__main__":
    main()
