"""Each epoch's weights appended to a zip archive (zipfile mode "a", one member per epoch) and a
copy of the checkpoint directory kept per epoch with shutil.copytree, the oldest removed with
shutil.rmtree beyond two; a directory renamed into place (os.rename of a temporary one). At the
end the archive's members and CRCs and the directory listing are the final state.
usage: zip_archive.py OUT [--epochs N]"""
import argparse
import io
import os
import shutil
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(8)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    archive = os.path.join(args.out, "weights.zip")
    step = 0
    for epoch in range(args.epochs):
        for _ in range(6):
            x = torch.randn(8, 4)
            loss = F.mse_loss(model(x), x[:, :2])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            progress(step)
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        with zipfile.ZipFile(archive, "a") as z:
            info = zipfile.ZipInfo(f"epoch_{epoch}.pt", date_time=(2020, 1, 1, 0, 0, 0))
            z.writestr(info, buf.getvalue())
        tmp = os.path.join(args.out, "ckpt.tmp")
        os.makedirs(tmp, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
        with open(os.path.join(tmp, "meta.txt"), "w") as f:
            f.write(f"epoch {epoch} step {step}\n")
        current = os.path.join(args.out, "ckpt")
        if os.path.exists(current):
            shutil.rmtree(current)
        os.rename(tmp, current)
        shutil.copytree(current, os.path.join(args.out, "history", f"epoch_{epoch}"))
        if epoch >= 2:
            shutil.rmtree(os.path.join(args.out, "history", f"epoch_{epoch - 2}"))
    with zipfile.ZipFile(archive) as z:
        members = [(i.filename, i.CRC, i.file_size) for i in z.infolist()]
    listing = sorted(os.path.relpath(os.path.join(r, n), args.out) for r, _, fs in os.walk(args.out) for n in fs)
    finish(model=model.state_dict(), members=members, listing=listing)


if __name__ == "__main__":
    main()
