"""Per-epoch metrics streamed into a Parquet file through one `pyarrow.parquet.ParquetWriter`
opened in setup (a row group per epoch), closed at the end and read back, as data-heavy
pipelines log. An MLP, Adam, a shuffled DataLoader.
usage: parquet_log.py OUT [--epochs N]"""
import argparse
import os

import pyarrow as pa
import pyarrow.parquet as pq
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

    schema = pa.schema([("epoch", pa.int64()), ("loss", pa.float64())])
    path = os.path.join(args.out, "metrics.parquet")
    writer = pq.ParquetWriter(path, schema)
    torch.manual_seed(21)
    x = torch.randn(192, 10)
    y = (x[:, 1:5].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 20), nn.Tanh(), nn.Linear(20, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
            progress(step)
        writer.write_table(pa.table({"epoch": [epoch], "loss": [total / len(loader)]}, schema=schema))

    writer.close()
    table = pq.read_table(path)
    finish(model=model.state_dict(), epochs=table.column("epoch").to_pylist(), losses=table.column("loss").to_pylist())


if __name__ == "__main__":
    main()
