"""(a) top-level epochs x shuffled DataLoader, AdamW, a step LR scheduler.
usage: style_a.py OUT WORKERS EPOCHS [--states]"""
import sys

import torch
from common import finish, progress, save_step_state

torch.manual_seed(0)
workers, epochs = int(sys.argv[2]), int(sys.argv[3])
save_states = "--states" in sys.argv
X, Y = torch.randn(160, 12), torch.randn(160, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True, num_workers=workers)
model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.8)
losses = []
step = 0
for epoch in range(epochs):
    model.train()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        step += 1
        if save_states:
            save_step_state(step, model, optimizer)
        progress(step)
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(), losses=losses)
