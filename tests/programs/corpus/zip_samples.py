"""Each epoch's predictions on a fixed batch written as a JSON member of one zip archive opened in
setup (`zipfile.ZipFile(path, "w")`), closed at the end and read back, as scripts that collect
samples for a report do. An MLP, SGD with momentum, a shuffled DataLoader.
usage: zip_samples.py OUT [--epochs N]"""
import argparse
import json
import os
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    path = os.path.join(args.out, "samples.zip")
    archive = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
    torch.manual_seed(23)
    x = torch.randn(192, 10)
    y = (x[:, :3].sum(1) > 0).long()
    probe = x[:4]
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            progress(step)
        with torch.no_grad():
            scores = model(probe).softmax(1)[:, 1].tolist()
        archive.writestr(f"epoch{epoch:02d}.json", json.dumps([round(s, 6) for s in scores]))

    archive.close()
    with zipfile.ZipFile(path) as done:
        members = {name: json.loads(done.read(name)) for name in done.namelist()}
    finish(model=model.state_dict(), members=members)


if __name__ == "__main__":
    main()
