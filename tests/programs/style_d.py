"""(d) a Trainer class whose fit method holds the loop. usage: style_d.py OUT EPOCHS"""
import sys

import torch
from common import finish, progress


class Trainer:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader
        self.optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
        self.step = 0
        self.log = []

    def train_step(self, x, y):
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                self.log.append(self.train_step(x, y))
                self.step += 1
                progress(self.step)


torch.manual_seed(3)
dataset = torch.utils.data.TensorDataset(torch.randn(96, 20), torch.randint(0, 4, (96,)))
trainer = Trainer(torch.nn.Sequential(torch.nn.Linear(20, 24), torch.nn.ReLU(), torch.nn.Linear(24, 4)),
                  torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True))
trainer.fit(int(sys.argv[2]))
finish(model=trainer.model.state_dict(), optimizer=trainer.optimizer.state_dict(), log=trainer.log)
