"""An iterator made in the epoch loop's body and advanced by hand in a step loop, as the
transformers Trainer does. usage: ff_manual_iter.py OUT STYLE EPOCHS
STYLE loader: `it = iter(loader)` over a shuffled DataLoader (the position can be restored);
generator: `it = batches()`, a generator function of the program's (restart runs it again to
its place, which its item's digest proves); genexpr: a generator expression, whose loop gpusnap
does not instrument (it cannot: restart must refuse); stream: an endless generator made once
before the epochs, `while True` drawing batches from a torch.Generator it owns (restart runs it
item by item to its place, which its fingerprint proves)."""
import sys

import torch
from common import finish, progress

torch.manual_seed(0)
style, epochs = sys.argv[2], int(sys.argv[3])
X, Y = torch.randn(96, 12), torch.randn(96, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
step = 0


def batches():
    for i in torch.randperm(96).split(8):
        yield X[i], Y[i]


def stream(seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        i = torch.randint(0, 96, (8,), generator=g)
        yield X[i], Y[i]


endless = stream(3) if style == "stream" else None
for epoch in range(epochs):
    if style == "stream":
        it = endless
    elif style == "genexpr":
        it = ((X[i], Y[i]) for i in torch.randperm(96).split(8))
    else:
        it = iter(loader) if style == "loader" else batches()
    for _ in range(len(loader)):
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        progress(step)
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), losses=losses)
