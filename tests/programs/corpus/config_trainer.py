"""A home-made trainer as projects grow their own: a dataclass config filled from argparse, a
Trainer class that owns model, optimizer, OneCycleLR and loaders and fires callbacks
(on_train_begin / on_batch_end / on_epoch_end / on_train_end) on a list of Callback objects: a
history recorder, an early-stopping callback keeping the best weights (a state_dict copy), and a
gradient-norm monitor. The trainer's state is a dataclass too; `fit()` loops over epochs and
calls `_train_epoch()`, whose batch loop does the steps. The model's class is defined inside
build_model(), with a BatchNorm whose running statistics no optimizer holds.
usage: config_trainer.py OUT [--epochs N] [--lr LR]"""
import argparse
import copy
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

from common import finish, progress


@dataclass
class Config:
    out: str
    epochs: int = 4
    lr: float = 3e-3
    batch_size: int = 24
    hidden: int = 48
    dropout: float = 0.1
    grad_clip: float = 1.0
    patience: int = 10
    seed: int = 2024


@dataclass
class TrainState:
    epoch: int = 0
    global_step: int = 0
    best_val: float = float("inf")
    should_stop: bool = False
    log: List[dict] = field(default_factory=list)


class Callback:
    def on_train_begin(self, trainer): pass
    def on_batch_end(self, trainer, loss): pass
    def on_epoch_end(self, trainer, val_loss): pass
    def on_train_end(self, trainer): pass


class History(Callback):
    def __init__(self):
        self.losses = []
        self.val_losses = []

    def on_batch_end(self, trainer, loss):
        self.losses.append(loss)

    def on_epoch_end(self, trainer, val_loss):
        self.val_losses.append(val_loss)


class EarlyStopping(Callback):
    def __init__(self, patience):
        self.patience = patience
        self.bad_epochs = 0
        self.best_weights: Optional[dict] = None

    def on_epoch_end(self, trainer, val_loss):
        if val_loss < trainer.state.best_val:
            trainer.state.best_val = val_loss
            self.bad_epochs = 0
            self.best_weights = copy.deepcopy(trainer.model.state_dict())
        else:
            self.bad_epochs += 1
            trainer.state.should_stop = self.bad_epochs >= self.patience


class GradNormMonitor(Callback):
    def __init__(self, every=5):
        self.every = every
        self.norms = []

    def on_batch_end(self, trainer, loss):
        if trainer.state.global_step % self.every == 0:
            self.norms.append(trainer.last_grad_norm)


class Trainer:
    def __init__(self, config: Config, model: nn.Module, train_loader, val_loader, callbacks=()):
        self.config = config
        self.model = model
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.callbacks = list(callbacks)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=config.lr * 3, total_steps=config.epochs * len(train_loader))
        self.state = TrainState()
        self.last_grad_norm = 0.0

    def _fire(self, event, *args):
        for callback in self.callbacks:
            getattr(callback, event)(self, *args)

    def _step(self, batch):
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits, y, label_smoothing=0.05)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.last_grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip))
        self.optimizer.step()
        self.scheduler.step()
        return loss.item()

    def _train_epoch(self):
        self.model.train()
        for batch in self.train_loader:
            loss = self._step(batch)
            self.state.global_step += 1
            self._fire("on_batch_end", loss)
            progress(self.state.global_step)

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        total, n = 0.0, 0
        for x, y in self.val_loader:
            total += F.cross_entropy(self.model(x), y, reduction="sum").item()
            n += len(y)
        return total / n

    def fit(self):
        self._fire("on_train_begin")
        while self.state.epoch < self.config.epochs and not self.state.should_stop:
            self._train_epoch()
            val_loss = self.evaluate()
            self.state.log.append({"epoch": self.state.epoch, "val_loss": val_loss, "lr": self.scheduler.get_last_lr()[0]})
            self._fire("on_epoch_end", val_loss)
            self.state.epoch += 1
        self._fire("on_train_end")
        return self.state


def build_data(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(360, 16, generator=g)
    w = torch.randn(16, 5, generator=g)
    y = (x @ w + 0.3 * torch.randn(360, 5, generator=g)).argmax(1)
    train_set, val_set = random_split(TensorDataset(x, y), [288, 72], generator=torch.Generator().manual_seed(cfg.seed))
    return (DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True),
            DataLoader(val_set, batch_size=cfg.batch_size))


def build_model(cfg: Config):
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, cfg.hidden), nn.BatchNorm1d(cfg.hidden), nn.GELU(), nn.Dropout(cfg.dropout))
            self.head = nn.Linear(cfg.hidden, 5)

        def forward(self, x):
            return self.head(self.body(x))

    return MLP()


def main():
    parser = argparse.ArgumentParser()
    for name, f in Config.__dataclass_fields__.items():
        if name == "out":
            parser.add_argument("out")
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(f.default), default=f.default)
    cfg = Config(**vars(parser.parse_args()))
    print(asdict(cfg))
    torch.manual_seed(cfg.seed)
    train_loader, val_loader = build_data(cfg)
    model = build_model(cfg)
    history, stopper, monitor = History(), EarlyStopping(cfg.patience), GradNormMonitor()
    trainer = Trainer(cfg, model, train_loader, val_loader, callbacks=[history, stopper, monitor])
    state = trainer.fit()
    finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), scheduler=trainer.scheduler.state_dict(),
           state=asdict(state), losses=history.losses, val_losses=history.val_losses, best=stopper.best_weights,
           norms=monitor.norms)


if __name__ == "__main__":
    main()
