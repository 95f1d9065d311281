"""Lightning's Trainer under a distributed strategy, as a multi-GPU job runs it (here on CPU over
gloo): `Trainer(devices=N, strategy="ddp")` launched by torchrun, whose ranks Lightning takes as
its own (without torchrun its launcher would start them itself). Lightning puts a
DistributedSampler in the shuffled loader and sets its epoch at each epoch's start; Adam with a
per-step schedule, validation each epoch, dropout (the masks differ per rank). Without
torchrun, WORLD_SIZE (default 2) devices, the others started by Lightning's launcher.
usage: lightning_ddp.py OUT EPOCHS"""
import os
import sys

# Each rank's files under OUT/rank<R>: torchrun gives RANK, Lightning's launcher only LOCAL_RANK (one node).
os.environ["RANK"] = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))
import lightning as L
import torch
from common import RANK, finish, progress


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        progress(len(self.losses))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main():
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(320, 8), torch.randn(320, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)
    model = Regressor()
    trainer = L.Trainer(max_epochs=int(sys.argv[2]), accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", "2")), strategy="ddp",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=sys.argv[1])
    trainer.fit(model, loader, val)
    finish(model=model.state_dict(), optimizer=trainer.optimizers[0].state_dict(),
           schedule=trainer.lr_scheduler_configs[0].scheduler.state_dict(), loops=trainer.fit_loop.state_dict(),
           losses=model.losses, logged=dict(trainer.logged_metrics), steps=trainer.global_step, rank=RANK)


if __name__ == "__main__":
    main()
