"""Lightning the way its docs lay a project out: a LightningDataModule (prepare_data, setup by
stage, a random train/val split, shuffled train_dataloader), a LightningModule that saves its
hyperparameters, logs with self.log_dict, keeps its training-step outputs in a list that
on_train_epoch_end turns into an epoch mean, and whose configure_optimizers returns AdamW with a
OneCycleLR stepped every step in a scheduler dict; a LearningRateMonitor callback and a callback
of ours with state; `trainer.fit(model, datamodule=dm)`. With --workers N the training DataLoader has N worker
processes (--persistent: kept from epoch to epoch, as Lightning recommends) and --augment jitters
each training sample with numpy's global RNG, seeded per worker by `seed_everything(workers=True)`.
usage: lightning_dm.py OUT [--epochs N] [--workers N] [--persistent] [--augment]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
import numpy as np
import torch
from common import finish, progress
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split


class Jittered(torch.utils.data.Dataset):
    """A sample and its label, the sample jittered by numpy's global generator."""

    def __init__(self, subset):
        self.subset = subset

    def __len__(self):
        return len(self.subset)

    def __getitem__(self, i):
        x, y = self.subset[i]
        return x + torch.from_numpy(np.random.normal(0, 0.02, x.shape).astype(np.float32)), y


class SpiralDataModule(L.LightningDataModule):
    def __init__(self, n=480, batch_size=24, workers=0, persistent=False, augment=False):
        super().__init__()
        self.n, self.batch_size = n, batch_size
        self.workers, self.persistent, self.augment = workers, persistent, augment

    def prepare_data(self):
        pass  # where a download would go

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(3)
        t = torch.rand(self.n, generator=g) * 4 * torch.pi
        label = torch.randint(0, 2, (self.n,), generator=g)
        r = t / (4 * torch.pi)
        angle = t + label * torch.pi
        x = torch.stack([r * torch.cos(angle), r * torch.sin(angle)], 1) + 0.02 * torch.randn(self.n, 2, generator=g)
        full = TensorDataset(x, label)
        self.train_set, self.val_set = random_split(full, [400, 80], generator=torch.Generator().manual_seed(4))

    def train_dataloader(self):
        data = Jittered(self.train_set) if self.augment else self.train_set
        return DataLoader(data, batch_size=self.batch_size, shuffle=True, num_workers=self.workers,
                          persistent_workers=self.persistent and self.workers > 0)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=40)


class SpiralClassifier(L.LightningModule):
    def __init__(self, hidden=32, lr=1e-2, epochs=3, steps_per_epoch=17):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2))
        self.training_step_outputs = []
        self.epoch_means = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        self.log_dict({"train_loss": loss, "train_acc": acc}, prog_bar=True)
        self.training_step_outputs.append(loss.detach())
        return loss

    def on_train_epoch_end(self):
        self.epoch_means.append(torch.stack(self.training_step_outputs).mean())
        self.training_step_outputs.clear()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.hparams.lr, total_steps=self.hparams.epochs * self.hparams.steps_per_epoch)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}


class StepCounter(L.Callback):
    def __init__(self):
        self.seen = 0
        self.val_losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen += 1
        progress(trainer.global_step)

    def on_validation_epoch_end(self, trainer, pl_module):
        if "val_loss" in trainer.callback_metrics:
            self.val_losses.append(float(trainer.callback_metrics["val_loss"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--augment", action="store_true")
    args = parser.parse_args()
    L.seed_everything(42, verbose=False, workers=args.workers > 0)
    dm = SpiralDataModule(workers=args.workers, persistent=args.persistent, augment=args.augment)
    model = SpiralClassifier(epochs=args.epochs)
    counter = StepCounter()
    lr_monitor = LearningRateMonitor(logging_interval="step")
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=CSVLogger(args.out, name="logs"),
        log_every_n_steps=4,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[lr_monitor, counter],
        default_root_dir=args.out,
    )
    trainer.fit(model, datamodule=dm)
    finish(
        model=model.state_dict(),
        optimizer=trainer.optimizers[0].state_dict(),
        schedule=trainer.lr_scheduler_configs[0].scheduler.state_dict(),
        loops=trainer.fit_loop.state_dict(),
        epoch_means=model.epoch_means,
        counter={"seen": counter.seen, "val_losses": counter.val_losses},
        lrs=lr_monitor.lrs,
        logged=dict(trainer.logged_metrics),
        steps=trainer.global_step,
    )


if __name__ == "__main__":
    main()
