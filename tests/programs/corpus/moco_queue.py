"""Momentum contrast (MoCo) pretraining as its reference code reads, then a linear probe: a
query encoder trained by SGD and a key encoder that follows it by momentum (`param_k.data =
param_k.data * m + ...`, a new tensor each step, no optimizer), a queue of negative keys in a
buffer written in place at a pointer buffer, shuffled BatchNorm by randperm, and two views of
each sample drawn in the dataset's __getitem__ (noise and a random crop, the global generator).
The probe freezes the encoder and trains a linear head over its features.
usage: moco_queue.py OUT [--epochs N] [--probe-epochs N]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import finish, progress


class TwoViews(Dataset):
    def __init__(self, signals):
        self.signals = signals

    def __len__(self):
        return len(self.signals)

    def view(self, s):
        start = torch.randint(0, 5, ()).item()
        crop = s[start:start + 28]
        return crop + 0.1 * torch.randn_like(crop)

    def __getitem__(self, i):
        s = self.signals[i]
        return self.view(s), self.view(s)


def encoder():
    return nn.Sequential(nn.Linear(28, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))


class MoCo(nn.Module):
    def __init__(self, dim=16, K=96, m=0.99, T=0.2):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = encoder()
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data = param_k.data * self.m + param_q.data * (1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            idx_shuffle = torch.randperm(im_k.shape[0])
            idx_unshuffle = torch.argsort(idx_shuffle)
            k = F.normalize(self.encoder_k(im_k[idx_shuffle]), dim=1)[idx_unshuffle]
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--probe-epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(11)
    t = torch.linspace(0, 6.28, 32)
    freq = torch.randint(1, 4, (192,))
    signals = torch.sin(freq[:, None].float() * t) + 0.2 * torch.randn(192, 32)
    loader = DataLoader(TwoViews(signals), batch_size=32, shuffle=True, drop_last=True)
    moco = MoCo()
    optimizer = torch.optim.SGD(moco.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    step, losses = 0, []
    for epoch in range(args.epochs):
        moco.train()
        for im_q, im_k in loader:
            logits, labels = moco(im_q, im_k)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            progress(step)

    backbone = moco.encoder_q.eval()
    for p in backbone.parameters():
        p.requires_grad = False
    head = nn.Linear(16, 3)
    probe_optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    probe_loader = DataLoader(list(zip(signals[:, 2:30], freq - 1)), batch_size=24, shuffle=True)
    probe_losses = []
    for epoch in range(args.probe_epochs):
        for x, y in probe_loader:
            with torch.no_grad():
                features = backbone(x)
            loss = F.cross_entropy(head(features), y)
            probe_optimizer.zero_grad()
            loss.backward()
            probe_optimizer.step()
            probe_losses.append(loss.item())
            step += 1
            progress(step)
    finish(moco=moco.state_dict(), head=head.state_dict(), losses=losses, probe_losses=probe_losses)


if __name__ == "__main__":
    main()
