"""A LightningModule fit by Lightning's Trainer on generated data, shuffled: Adam with a per-step
LR schedule, validation twice per epoch, metrics logged to CSV, a callback that reports progress
and keeps the losses.
usage: lightning_fit.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
from lightning.pytorch.loggers import CSVLogger
import torch
from common import finish, progress


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Progress(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        progress(trainer.global_step)


def main():
    parser = argparse.ArgumentParser(description="a Lightning fit")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(320, 8), torch.randn(320, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    model = Regressor()
    progress_callback = Progress()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=CSVLogger(args.out, name="logs"),
        log_every_n_steps=3,
        val_check_interval=0.5,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[progress_callback],
        default_root_dir=args.out,
    )
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)
    trainer.fit(model, loader, val)
    finish(
        model=model.state_dict(),
        optimizer=trainer.optimizers[0].state_dict(),
        schedule=trainer.lr_scheduler_configs[0].scheduler.state_dict(),
        loops=trainer.fit_loop.state_dict(),
        losses=progress_callback.losses,
        logged=dict(trainer.logged_metrics),
        # Not the CSV file: each logging step appends to it, and a killed run's rows stay.
        logger={"version": trainer.logger.version, "columns": trainer.logger.experiment.metrics_keys},
        steps=trainer.global_step,
    )


if __name__ == "__main__":
    main()
