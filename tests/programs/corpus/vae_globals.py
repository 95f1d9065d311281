"""A variational autoencoder written as a flat script: the model, optimizer and data are module
globals made at the top level, `train(epoch)` and `test(epoch)` are module functions that use
them, the epoch loop runs at module level, and after each epoch a sample of decoded noise is
written to results/sample_<epoch>.npy (the script makes the folder with `os.makedirs`).
usage: vae_globals.py OUT [--epochs N]"""
import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from common import finish, progress

parser = argparse.ArgumentParser(description="VAE")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--log-interval", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(1)
device = torch.device("cpu")
images = torch.sigmoid(torch.randn(256, 64) @ torch.randn(64, 64) / 4)
train_loader = DataLoader(TensorDataset(images[:192]), batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(TensorDataset(images[192:]), batch_size=args.batch_size, shuffle=False)
results = os.path.join(args.out, "results")
os.makedirs(results, exist_ok=True)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 48)
        self.fc21 = nn.Linear(48, 6)
        self.fc22 = nn.Linear(48, 6)
        self.fc3 = nn.Linear(6, 48)
        self.fc4 = nn.Linear(48, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE().to(device)
optimizer = optim.Adam(model.parameters(), lr=1e-3)
steps = 0
history = []


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def train(epoch):
    global steps
    model.train()
    train_loss = 0
    for batch_idx, (data,) in enumerate(train_loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
        steps += 1
        progress(steps)
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item() / len(data):.6f}")
    history.append(train_loss / len(train_loader.dataset))


def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for (data,) in test_loader:
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
    print(f"====> Epoch {epoch} test set loss: {test_loss / len(test_loader.dataset):.4f}")
    return test_loss


for epoch in range(1, args.epochs + 1):
    train(epoch)
    test(epoch)
    with torch.no_grad():
        sample = model.decode(torch.randn(8, 6).to(device)).cpu()
        np.save(os.path.join(results, f"sample_{epoch}.npy"), sample.numpy())

samples = [torch.from_numpy(np.load(os.path.join(results, f"sample_{e}.npy"))) for e in range(1, args.epochs + 1)]
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history, samples=samples)
