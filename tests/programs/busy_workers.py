"""Every core busy: three persistent DataLoader workers each keep a thread spinning (as workers that
decode and augment ahead do) and the training loop spins too, so that a process at idle priority
gets no CPU until the program ends. usage: busy_workers.py OUT STEPS"""
import sys
import threading
import time

import torch
from common import finish, progress


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def spin_forever(worker_id: int) -> None:
    threading.Thread(target=spin, args=(1e9,), daemon=True).start()


class Spinning(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        spin(0.01)
        return torch.full((16,), float(i % 7))


if __name__ == "__main__":
    torch.manual_seed(4)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = torch.randn(1 << 24)  # 64 MiB that changes every step: seconds of a writer's CPU
    loader = torch.utils.data.DataLoader(Spinning(), batch_size=4, num_workers=3, persistent_workers=True,
                                         worker_init_fn=spin_forever)
    for step, batch in enumerate(loader):
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state += 1
        spin(0.1)
        progress(step + 1)
        if step + 1 == int(sys.argv[2]):
            break
    finish(model=model.state_dict(), state=state[:8])
