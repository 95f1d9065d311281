"""Accelerate on torchrun's ranks with save_state every 6 steps into numbered checkpoints (the
last 2 kept), each rank's RNG states among them; the newest loaded back at start if one exists,
the epoch's taken batches skipped.
usage: accelerate_state_ddp.py OUT EPOCHS"""
import os
import re
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from common import finish, progress


def main():
    epochs = int(sys.argv[2])
    project = os.path.join(sys.argv[1], "project")
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    set_seed(0)
    X, Y = torch.randn(192, 6), torch.randn(192, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(24, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    start_epoch, resume_step, overall = 0, None, 0
    ckpt_dir = os.path.join(project, "checkpoints")
    if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
        newest = max(os.listdir(ckpt_dir), key=lambda d: int(re.findall(r"\d+", d)[-1]))
        accelerator.load_state(os.path.join(ckpt_dir, newest))
        overall = (int(re.findall(r"\d+", newest)[-1]) + 1) * 6
        start_epoch, resume_step = divmod(overall, len(loader))
        config.iteration = int(re.findall(r"\d+", newest)[-1]) + 1
    losses = []
    for epoch in range(start_epoch, epochs):
        model.train()
        active = accelerator.skip_first_batches(loader, resume_step) if resume_step else loader
        resume_step = None
        for x, y in active:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            overall += 1
            losses.append(round(loss.item(), 6))
            if overall % 6 == 0:
                accelerator.save_state()
            progress(overall)
    accelerator.wait_for_everyone()
    model = accelerator.unwrap_model(model)
    finish(model=model.state_dict(), losses=losses, listing=sorted(os.listdir(ckpt_dir)))


if __name__ == "__main__":
    main()
