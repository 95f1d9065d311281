"""A small GPT-style model in bf16 autocast with gradient accumulation: token embeddings, causal
attention written out (matmuls only, deterministic), AdamW with a cosine schedule, and a
gradient scaler's bookkeeping in fp32. usage: gpt.py OUT STEPS"""

import math
import sys

import torch
from torch import nn

from gpu import DEVICE, finish, on_cpu, progress

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 256, 32, 64, 4, 2
ACCUMULATE = 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(WIDTH // HEADS)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batches(corpus: torch.Tensor, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(corpus) - CONTEXT - 1, (8,), generator=generator)
        yield torch.stack([corpus[s : s + CONTEXT + 1] for s in starts.tolist()])


def main(steps: int) -> None:
    torch.manual_seed(0)
    corpus = torch.randint(0, VOCAB, (20_000,), generator=torch.Generator().manual_seed(2))
    model = TinyGPT().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    data = batches(corpus, torch.Generator().manual_seed(3))
    step, micro = 0, 0
    while step < steps:
        chunk = next(data).to(DEVICE)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            logits = model(chunk[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), chunk[:, 1:].reshape(-1)) / ACCUMULATE
        loss.backward()
        micro += 1
        if micro % ACCUMULATE == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            progress(step)
    finish(model=on_cpu(model.state_dict()), optimizer=on_cpu(optimizer.state_dict()["state"]), lr=schedule.get_last_lr())


if __name__ == "__main__":
    main(int(sys.argv[2]))
