"""A character-level transformer trained the way nanoGPT-style scripts are written: everything at
module level (config globals, no main()), the token ids written once to train.bin/val.bin and
read back through np.memmap, get_batch() drawing offsets with torch.randint, `while True:` with
iter_num and a cosine learning rate from get_lr(it) set into the param groups by hand, gradient
accumulation whose next batch is fetched while the current micro-step runs, estimate_loss()
every eval_interval under torch.no_grad() with model.eval(), and ckpt.pt saved when the
validation loss improves.
usage: nanogpt_style.py OUT [--max-iters N]"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from common import finish, progress

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--max-iters", type=int, default=48)
args = parser.parse_args()

out_dir = args.out
block_size, batch_size, n_embd, n_head = 16, 8, 32, 4
gradient_accumulation_steps = 2
eval_interval, eval_iters = 12, 4
learning_rate, min_lr, warmup_iters, lr_decay_iters = 3e-3, 3e-4, 6, args.max_iters
max_iters = args.max_iters
torch.manual_seed(1337)

# prepare the data once, as a prepare.py would
text = "".join(f"the {w} saw a {v} near the {u}.\n" for w in ("cat", "dog", "bird") for v in ("tree", "ball", "cloud")
               for u in ("house", "river", "road")) * 6
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
ids = np.array([stoi[c] for c in text], dtype=np.uint16)
split = int(0.9 * len(ids))
ids[:split].tofile(os.path.join(out_dir, "train.bin"))
ids[split:].tofile(os.path.join(out_dir, "val.bin"))
train_data = np.memmap(os.path.join(out_dir, "train.bin"), dtype=np.uint16, mode="r")
val_data = np.memmap(os.path.join(out_dir, "val.bin"), dtype=np.uint16, mode="r")


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(0.1))
        self.register_buffer("mask", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:x.size(1), :x.size(1)], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        logits = self.lm_head(self.ln_f(self.blocks(x)))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


model = GPT(len(chars))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)


X, Y = get_batch("train")  # fetch the very first batch
iter_num, best_val_loss, history = 0, 1e9, []
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        history.append((iter_num, losses["train"], losses["val"]))
        if losses["val"] < best_val_loss:
            best_val_loss = losses["val"]
            if iter_num > 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                            "best_val_loss": best_val_loss}, os.path.join(out_dir, "ckpt.pt"))
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")  # the next batch, fetched while the GPU would compute
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    progress(iter_num)
    if iter_num > max_iters:
        break

ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=False)
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history, ckpt_iter=ckpt["iter_num"],
       ckpt_model=ckpt["model"])
