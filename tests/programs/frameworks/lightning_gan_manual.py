"""A GAN in Lightning with manual optimization, as Lightning's docs write one: two optimizers,
toggle_optimizer, manual_backward, noise drawn from the global generator in each step.
usage: lightning_gan_manual.py OUT [--epochs N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
import torch
from common import finish, progress
from torch import nn


class GAN(L.LightningModule):
    def __init__(self, latent=8):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, 32), nn.LeakyReLU(0.2), nn.Linear(32, 16))
        self.discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(32, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent)
        self.toggle_optimizer(opt_g)
        fake = self.generator(z)
        g_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(fake), torch.ones(real.shape[0], 1))
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(real), torch.ones(real.shape[0], 1))
        fake_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), torch.zeros(real.shape[0], 1))
        d_loss = (real_loss + fake_loss) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)
        self.losses.append((g_loss.item(), d_loss.item()))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        progress(len(self.losses))

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        return [opt_g, opt_d], []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    L.seed_everything(3, verbose=False)
    real = torch.randn(256, 16) * 0.5 + torch.linspace(-1, 1, 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(real), batch_size=16, shuffle=True)
    model = GAN()
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.out)
    trainer.fit(model, loader)
    opt_g, opt_d = trainer.optimizers
    finish(model=model.state_dict(), opt_g=opt_g.state_dict(), opt_d=opt_d.state_dict(), losses=model.losses,
           steps=trainer.global_step)


if __name__ == "__main__":
    main()
