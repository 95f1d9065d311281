"""Lightning with the callbacks guides stack: StochasticWeightAveraging from epoch 2 (it swaps the
optimizer's rates for its own schedule and averages the weights each epoch), a
GradientAccumulationScheduler accumulating 2 batches from epoch 1, validation twice an epoch,
EarlyStopping on the validation loss, a LearningRateMonitor into a CSVLogger.
usage: lightning_swa.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, GradientAccumulationScheduler, LearningRateMonitor, StochasticWeightAveraging
from lightning.pytorch.loggers import CSVLogger
import torch
from common import finish, progress


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)}


class Progress(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(round(outputs["loss"].item(), 6))
        progress(trainer.global_step)


def main():
    parser = argparse.ArgumentParser(description="Lightning with SWA, accumulation, early stopping")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    L.seed_everything(5, verbose=False)
    w = torch.randn(6, 1)
    x = torch.randn(400, 6)
    y = x @ w + 0.1 * torch.randn(400, 1)
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:320], y[:320]), batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[320:], y[320:]), batch_size=40)
    model = Regressor()
    progress_callback = Progress()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=CSVLogger(args.out, name="logs", version=0),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=0.5,
        callbacks=[StochasticWeightAveraging(swa_lrs=5e-3, swa_epoch_start=2, annealing_epochs=1),
                   GradientAccumulationScheduler(scheduling={0: 1, 1: 2}),
                   EarlyStopping(monitor="val_loss", patience=3),
                   LearningRateMonitor(logging_interval="step"), progress_callback],
    )
    trainer.fit(model, train, val)
    with open(os.path.join(args.out, "logs", "version_0", "metrics.csv")) as f:
        metrics = f.read()
    finish(model=model.state_dict(), losses=progress_callback.losses, steps=trainer.global_step, metrics=metrics)


if __name__ == "__main__":
    main()
