"""A graph convolutional network on a random graph in the manner of the PyTorch examples' gcn:
a normalized sparse adjacency (COO, coalesced) built in setup, features, masks for train and
validation, two graph convolutions through torch.sparse.mm, Adam with weight decay, early
stopping on the validation loss with the best weights kept in memory. One step per epoch.
usage: gcn.py OUT [--epochs N]"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import finish, progress


class GraphConv(nn.Module):
    def __init__(self, features_in, features_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(features_in, features_out))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x, adj):
        return torch.sparse.mm(adj, x @ self.weight)


class GCN(nn.Module):
    def __init__(self, features_in, hidden, classes):
        super().__init__()
        self.conv1, self.conv2 = GraphConv(features_in, hidden), GraphConv(hidden, classes)

    def forward(self, x, adj):
        return self.conv2(F.dropout(F.relu(self.conv1(x, adj)), 0.5, self.training), adj)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    n = 80
    edges = torch.randint(0, n, (2, 300))
    edges = torch.cat([edges, edges.flip(0), torch.arange(n).repeat(2, 1)], 1)
    adj = torch.sparse_coo_tensor(edges, torch.ones(edges.size(1)), (n, n)).coalesce()
    deg = torch.sparse.sum(adj, 1).to_dense()
    i = adj.indices()
    adj = torch.sparse_coo_tensor(i, adj.values() / (deg[i[0]].sqrt() * deg[i[1]].sqrt()), (n, n)).coalesce()
    features, labels = torch.randn(n, 12), torch.randint(0, 3, (n,))
    train_mask = torch.zeros(n, dtype=torch.bool)
    train_mask[:50] = True
    val_mask = ~train_mask
    model = GCN(12, 16, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best, best_state, bad, history = float("inf"), None, 0, []
    for epoch in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        out = model(features, adj)
        loss = F.cross_entropy(out[train_mask], labels[train_mask])
        loss.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            val = F.cross_entropy(model(features, adj)[val_mask], labels[val_mask]).item()
        history.append((round(loss.item(), 6), round(val, 6)))
        if val < best:
            best, best_state, bad = val, copy.deepcopy(model.state_dict()), 0
        else:
            bad += 1
            if bad >= 15:
                break
        progress(epoch + 1)
    model.load_state_dict(best_state)
    finish(model=model.state_dict(), history=history, best=best)


if __name__ == "__main__":
    main()
