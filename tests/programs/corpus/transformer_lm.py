"""A Transformer language model the way PyTorch's tutorial writes one: positional encoding as a
buffer, a causal mask, batchify and get_batch over one long token stream, bptt windows, clipping,
StepLR, and a deep copy of the best model by validation loss.
usage: transformer_lm.py OUT [--epochs N]"""
import argparse
import copy
import math

import torch
import torch.nn as nn

from common import finish, progress


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=200):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.size(0)])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, d_model=32, nhead=2, d_hid=64, nlayers=2, dropout=0.2):
        super().__init__()
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        layer = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)

    def forward(self, src, src_mask):
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        return self.linear(self.transformer_encoder(src, src_mask))


def batchify(data, bsz):
    seq_len = data.size(0) // bsz
    return data[: seq_len * bsz].view(bsz, seq_len).t().contiguous()


bptt = 12


def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def evaluate(model, data, ntokens):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            d, t = get_batch(data, i)
            mask = nn.Transformer.generate_square_subsequent_mask(d.size(0))
            total += len(d) * nn.functional.cross_entropy(model(d, mask).view(-1, ntokens), t).item()
    return total / (len(data) - 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(42)
    ntokens = 50
    stream = torch.randint(0, ntokens, (1400,))
    stream[1::3] = (stream[::3][: stream[1::3].numel()] * 7 + 3) % ntokens
    train_data = batchify(stream[:1200], 8)
    val_data = batchify(stream[1200:], 4)
    model = TransformerModel(ntokens)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)
    best_val_loss = float("inf")
    best_model = None
    step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            data, targets = get_batch(train_data, i)
            mask = nn.Transformer.generate_square_subsequent_mask(data.size(0))
            output = model(data, mask)
            loss = criterion(output.view(-1, ntokens), targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            step += 1
            progress(step)
        val_loss = evaluate(model, val_data, ntokens)
        if val_loss < best_val_loss:
            best_val_loss = val_loss
            best_model = copy.deepcopy(model)
        scheduler.step()
    finish(model=model.state_dict(), best=best_model.state_dict(), best_val_loss=best_val_loss)


if __name__ == "__main__":
    main()
