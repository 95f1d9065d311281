"""A variational autoencoder in the manner of the PyTorch examples' vae: everything at module
level, train(epoch) and test(epoch) reading the module's model, optimizer and loaders, called
from `for epoch in range(1, args.epochs + 1)`; the reparameterization draws noise inside every
step; after each epoch a batch of samples is decoded from fresh noise and saved. The "images"
are generated 12x12 blobs in [0, 1].
usage: vae.py OUT [--epochs N] [--batch-size B] ..."""
from __future__ import print_function

import argparse
import os

import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

from common import finish, progress

parser = argparse.ArgumentParser(description='VAE Example')
parser.add_argument('out', help='where samples and final.pt go')
parser.add_argument('--batch-size', type=int, default=32, metavar='N',
                    help='input batch size for training (default: 32)')
parser.add_argument('--epochs', type=int, default=4, metavar='N',
                    help='number of epochs to train (default: 4)')
parser.add_argument('--no-accel', action='store_true', default=False,
                    help='disables accelerator')
parser.add_argument('--seed', type=int, default=1, metavar='S',
                    help='random seed (default: 1)')
parser.add_argument('--log-interval', type=int, default=4, metavar='N',
                    help='how many batches to wait before logging training status')
args = parser.parse_args()

torch.manual_seed(args.seed)

device = torch.device("cpu")

kwargs = {'num_workers': 0, 'pin_memory': False}


def blobs(count, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(count, 2, generator=g) * 8 + 2
    grid = torch.stack(torch.meshgrid(torch.arange(12.), torch.arange(12.), indexing='ij'), -1)
    dist = ((grid[None] - centres[:, None, None, :]) ** 2).sum(-1)
    images = torch.exp(-dist / 6.0).clamp(0, 1)
    return torch.utils.data.TensorDataset(images.unsqueeze(1), torch.zeros(count))


train_loader = torch.utils.data.DataLoader(blobs(384, 10), batch_size=args.batch_size, shuffle=True, **kwargs)
test_loader = torch.utils.data.DataLoader(blobs(96, 11), batch_size=args.batch_size, shuffle=False, **kwargs)


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()

        self.fc1 = nn.Linear(144, 64)
        self.fc21 = nn.Linear(64, 6)
        self.fc22 = nn.Linear(64, 6)
        self.fc3 = nn.Linear(6, 64)
        self.fc4 = nn.Linear(64, 144)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 144))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE().to(device)
optimizer = optim.Adam(model.parameters(), lr=1e-3)
train_losses = []
test_losses = []
samples = []


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 144), reduction='sum')

    # see Appendix B from VAE paper:
    # Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
    # https://arxiv.org/abs/1312.6114
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    return BCE + KLD


def train(epoch):
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
        train_losses.append(loss.item())
        progress(len(train_losses))
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader),
                loss.item() / len(data)))

    print('====> Epoch: {} Average loss: {:.4f}'.format(
          epoch, train_loss / len(train_loader.dataset)))


def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for i, (data, _) in enumerate(test_loader):
            data = data.to(device)
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
            if i == 0:
                n = min(data.size(0), 8)
                comparison = torch.cat([data[:n],
                                      recon_batch.view(args.batch_size, 1, 12, 12)[:n]])
                torch.save(comparison.cpu(), os.path.join(args.out, 'reconstruction_' + str(epoch) + '.pt'))

    test_loss /= len(test_loader.dataset)
    test_losses.append(test_loss)
    print('====> Test set loss: {:.4f}'.format(test_loss))


if __name__ == "__main__":
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test(epoch)
        with torch.no_grad():
            sample = torch.randn(16, 6).to(device)
            sample = model.decode(sample).cpu()
            samples.append(sample)
            torch.save(sample.view(16, 1, 12, 12), os.path.join(args.out, 'sample_' + str(epoch) + '.pt'))
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), train_losses=train_losses,
           test_losses=test_losses, samples=samples)
