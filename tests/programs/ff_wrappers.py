"""Epochs over a shuffled DataLoader seen through a wrapper. usage: ff_wrappers.py OUT STYLE EPOCHS
STYLE: tqdm (`for b in tqdm(loader)`), pbar (`pbar = tqdm(loader)`, then `for b in pbar`),
enumerate-tqdm (`enumerate(tqdm(loader))`), tqdm-enumerate (`tqdm(enumerate(loader))`),
islice (`islice(loader, 9)`)."""
import itertools
import sys

import torch
from common import finish, progress
from tqdm import tqdm

torch.manual_seed(0)
style, epochs = sys.argv[2], int(sys.argv[3])
X, Y = torch.randn(96, 12), torch.randn(96, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = []
step = 0


def train(x, y):
    global step
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    step += 1
    progress(step)


for epoch in range(epochs):
    if style == "tqdm":
        for x, y in tqdm(loader, mininterval=3600):
            train(x, y)
    elif style == "pbar":
        pbar = tqdm(loader, mininterval=3600)
        for x, y in pbar:
            train(x, y)
    elif style == "enumerate-tqdm":
        for i, (x, y) in enumerate(tqdm(loader, mininterval=3600)):
            train(x, y + i)
    elif style == "tqdm-enumerate":
        for i, (x, y) in tqdm(enumerate(loader), total=len(loader), mininterval=3600):
            train(x, y + i)
    elif style == "islice":
        for x, y in itertools.islice(loader, 9):
            train(x, y)
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses, step=step)
