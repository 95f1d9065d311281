"""A plain PyTorch loop over a Hugging Face `datasets` stream: a Dataset made from a dict, turned
into an IterableDataset of 4 shards, shuffled with a buffer (`shuffle(seed, buffer_size)`), mapped
to tensors, with `set_epoch` at each epoch so the order changes, batched by a torch DataLoader.
usage: hf_datasets_stream.py OUT [--epochs N]"""
import argparse

import datasets
import torch
from torch import nn

from common import finish, progress


def to_features(example):
    return {"x": [float(v) / 10 for v in example["raw"]], "y": example["label"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 20, (240, 6), generator=g)
    table = datasets.Dataset.from_dict({"raw": raw.tolist(), "label": (raw[:, 0] > raw[:, 1]).long().tolist()})
    stream = table.to_iterable_dataset(num_shards=4).shuffle(seed=11, buffer_size=32).map(to_features, remove_columns=["raw", "label"])
    stream = stream.with_format("torch")
    loader = torch.utils.data.DataLoader(stream, batch_size=16)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, step = [], 0
    for epoch in range(args.epochs):
        stream.set_epoch(epoch)
        for batch in loader:
            loss = nn.functional.cross_entropy(model(batch["x"].float()), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)
        print(f"epoch {epoch}: mean loss {sum(losses[-15:]) / 15:.4f}")
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)


if __name__ == "__main__":
    main()
