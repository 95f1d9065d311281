"""A WGAN with gradient penalty as GAN scripts write one: a critic stepped on every batch and the
generator every --n-critic batches (`if i % n_critic == 0`), the penalty from
torch.autograd.grad(create_graph=True) at points interpolated with torch.rand, Adam with betas
(0.0, 0.9) for both, fixed noise for samples kept every epoch, and the batch loop over
`enumerate(dataloader)` whose batches are 2-D points from a mixture of Gaussians.
usage: wgan_gp.py OUT [--epochs N] [--n-critic K]"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress


def mixture(n, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    return centres[torch.randint(4, (n,), generator=g)] + 0.1 * torch.randn(n, 2, generator=g)


def gradient_penalty(critic, real, fake):
    alpha = torch.rand(real.size(0), 1)
    points = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    grads = torch.autograd.grad(critic(points).sum(), points, create_graph=True)[0]
    return ((grads.norm(2, dim=1) - 1) ** 2).mean()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--n-critic", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(9)
    dataloader = DataLoader(TensorDataset(mixture(192, 10)), batch_size=16, shuffle=True)
    netG = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    netD = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.0, 0.9))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.0, 0.9))
    fixed_noise = torch.randn(8, 4)
    samples, step = [], 0

    for epoch in range(args.epochs):
        for i, (real,) in enumerate(dataloader):
            fake = netG(torch.randn(real.size(0), 4)).detach()
            lossD = netD(fake).mean() - netD(real).mean() + 10 * gradient_penalty(netD, real, fake)
            optD.zero_grad()
            lossD.backward()
            optD.step()
            if i % args.n_critic == 0:
                lossG = -netD(netG(torch.randn(real.size(0), 4))).mean()
                optG.zero_grad()
                lossG.backward()
                optG.step()
            step += 1
            progress(step)
        with torch.no_grad():
            samples.append(netG(fixed_noise))

    finish(netG=netG.state_dict(), netD=netD.state_dict(), optD=optD.state_dict(), optG=optG.state_dict(), samples=samples)


if __name__ == "__main__":
    main()
