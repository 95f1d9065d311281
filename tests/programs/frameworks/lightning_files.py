"""A Lightning project that leaves files behind, as most do: a LightningDataModule whose training
DataLoader has two persistent workers, a CSVLogger (and a TensorBoardLogger with --tensorboard),
ModelCheckpoint keeping the two best epochs by val_loss and the last one, LearningRateMonitor
and EarlyStopping, validation at the end of every epoch.
usage: lightning_files.py OUT [--epochs N] [--tensorboard]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
import torch
from common import finish, progress
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


class RingsDataModule(L.LightningDataModule):
    def __init__(self, batch_size=20):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(400, 4, generator=g)
        y = (x.norm(dim=1) > 2).long()
        self.train_set = TensorDataset(x[:320], y[:320])
        self.val_set = TensorDataset(x[320:], y[320:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=2, persistent_workers=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=40)


class Rings(L.LightningModule):
    def __init__(self, lr=5e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Progress(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        progress(trainer.global_step)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tensorboard", action="store_true")
    args = parser.parse_args()
    L.seed_everything(7, verbose=False)
    loggers = [CSVLogger(args.out, name="logs")]
    if args.tensorboard:
        loggers.append(TensorBoardLogger(args.out, name="tb"))
    checkpoints = ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True, filename="{epoch}-{val_loss:.4f}")
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=loggers,
        log_every_n_steps=5,
        callbacks=[checkpoints, LearningRateMonitor(logging_interval="step"), EarlyStopping(monitor="val_loss", patience=3),
                   Progress()],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
    )
    model = Rings()
    trainer.fit(model, datamodule=RingsDataModule())
    finish(model=model.state_dict(), optimizer=trainer.optimizers[0].state_dict(), steps=trainer.global_step,
           best=os.path.basename(checkpoints.best_model_path))


if __name__ == "__main__":
    main()
