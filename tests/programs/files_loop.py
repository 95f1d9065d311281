"""A plain training loop that leaves files behind as scripts do: a log appended through a logging
FileHandler, a results.json rewritten at every epoch's end, a CSV line appended per step, a
checkpoint per epoch with the older ones removed (the last two kept), and a directory per epoch
of samples written by the DataLoader's worker processes.
usage: files_loop.py OUT [--epochs N]"""
import argparse
import contextlib
import json
import logging
import os

import torch
from common import finish, progress
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger("train")


class Noisy(Dataset):
    def __init__(self, out, n=96):
        self.out = out
        self.x = torch.randn(n, 6, generator=torch.Generator().manual_seed(2))
        self.y = self.x.sum(1, keepdim=True)
        self.epoch = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i % 16 == 0:  # a worker keeps a sample now and then, as augmentation debugging does
            folder = os.path.join(self.out, "samples", f"epoch{self.epoch}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{i}.txt"), "w") as f:
                f.write(" ".join(f"{v:.6f}" for v in self.x[i].tolist()))
        return self.x[i], self.y[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(filename=os.path.join(args.out, "train.log"), level=logging.INFO, format="%(levelname)s %(message)s")
    log.info("starting: %d epochs", args.epochs)
    torch.manual_seed(0)
    data = Noisy(args.out)
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2, persistent_workers=False)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    os.makedirs(os.path.join(args.out, "checkpoints"), exist_ok=True)
    results = {"epochs": []}
    step = 0
    for epoch in range(args.epochs):
        data.epoch = epoch
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            total += loss.item()
            with open(os.path.join(args.out, "steps.csv"), "a") as f:
                f.write(f"{step},{loss.item():.8f}\n")
            progress(step)
        log.info("epoch %d: mean loss %.6f", epoch, total / len(loader))
        results["epochs"].append({"epoch": epoch, "loss": round(total / len(loader), 8)})
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        torch.save(model.state_dict(), os.path.join(args.out, "checkpoints", f"epoch{epoch}.pt"))
        if epoch >= 2:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(args.out, "checkpoints", f"epoch{epoch - 2}.pt"))
    log.info("done")
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), results=results)


if __name__ == "__main__":
    main()
