"""Layer-local training without backpropagation through the network (the Forward-Forward
algorithm): the network keeps its layers in a plain list, each layer is an `nn.Linear` subclass
with its own Adam and its own `train(x_pos, x_neg)` loop that shadows `nn.Module.train`, and the
network trains the layers one after another, each on the previous layer's detached outputs.
Positive samples carry their true label one-hot in the first pixels, negatives a wrong one.
usage: forward_forward.py OUT [--epochs N]"""
import argparse

import torch
import torch.nn as nn

from common import finish, progress

STEPS = 0


def overlay(x, labels, classes):
    x = x.clone()
    x[:, :classes] = 0.0
    x[range(len(x)), labels] = x.max()
    return x


class Layer(nn.Linear):
    def __init__(self, dim_in, dim_out, epochs):
        super().__init__(dim_in, dim_out)
        self.relu = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)
        self.threshold = 2.0
        self.epochs = epochs
        self.losses = []

    def forward(self, x):
        x = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos, x_neg):
        global STEPS
        for _ in range(self.epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.losses.append(loss.item())
            STEPS += 1
            progress(STEPS)
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(nn.Module):
    def __init__(self, dims, epochs):
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1], epochs) for d in range(len(dims) - 1)]

    def predict(self, x, classes):
        goodness_per_label = []
        for label in range(classes):
            h = overlay(x, torch.full((len(x),), label), classes)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness.append(h.pow(2).mean(1))
            goodness_per_label.append(sum(goodness).unsqueeze(1))
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train(self, x_pos, x_neg):
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer", i, "...")
            h_pos, h_neg = layer.train(h_pos, h_neg)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=25)
    args = parser.parse_args()

    torch.manual_seed(1234)
    classes = 4
    centers = torch.randn(classes, 24) * 2
    labels = torch.randint(classes, (128,))
    x = centers[labels] + torch.randn(128, 24)
    net = Net([24, 32, 32], args.epochs)
    x_pos = overlay(x, labels, classes)
    x_neg = overlay(x, (labels + torch.randint(1, classes, (128,))) % classes, classes)
    net.train(x_pos, x_neg)
    accuracy = (net.predict(x, classes) == labels).float().mean().item()
    print("train accuracy:", accuracy)
    finish(layers=[layer.state_dict() for layer in net.layers], opts=[layer.opt.state_dict() for layer in net.layers],
           losses=[layer.losses for layer in net.layers], accuracy=accuracy)


if __name__ == "__main__":
    main()
