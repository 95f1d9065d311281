"""A LightningModule fit by Lightning's Trainer on generated data; a callback reports progress.
usage: lightning_fit.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
import torch
from common import finish, progress


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class Progress(L.Callback):
    def on_train_batch_end(self, trainer, *args):
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
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Progress()],
        default_root_dir=args.out,
    )
    trainer.fit(model, loader)
    finish(model=model.state_dict(), steps=trainer.global_step)


if __name__ == "__main__":
    main()
