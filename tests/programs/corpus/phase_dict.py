"""The PyTorch transfer-learning tutorial's train_model, as countless scripts copy it: per epoch,
`for phase in ['train', 'val']`, model.train() or model.eval(), one inner loop over
dataloaders[phase] with `with torch.set_grad_enabled(phase == 'train')`, the optimizer stepped in
the train phase only, the scheduler stepped after it, the best weights deep-copied when the
validation accuracy improves and loaded back at the end.
usage: phase_dict.py OUT [--epochs N]"""
import argparse
import copy
import time

import torch
from torch import nn

from common import finish, progress


def train_model(model, criterion, optimizer, scheduler, dataloaders, dataset_sizes, num_epochs):
    since = time.time()
    best_model_wts = copy.deepcopy(model.state_dict())
    best_acc = 0.0
    history = []
    steps = 0
    for epoch in range(num_epochs):
        print(f"Epoch {epoch}/{num_epochs - 1}")
        for phase in ["train", "val"]:
            if phase == "train":
                model.train()
            else:
                model.eval()
            running_loss = 0.0
            running_corrects = 0
            for inputs, labels in dataloaders[phase]:
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    _, preds = torch.max(outputs, 1)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                        steps += 1
                        progress(steps)
                running_loss += loss.item() * inputs.size(0)
                running_corrects += torch.sum(preds == labels.data)
            if phase == "train":
                scheduler.step()
            epoch_loss = running_loss / dataset_sizes[phase]
            epoch_acc = running_corrects.double() / dataset_sizes[phase]
            history.append((phase, epoch_loss, epoch_acc.item()))
            print(f"{phase} Loss: {epoch_loss:.4f} Acc: {epoch_acc:.4f}")
            if phase == "val" and epoch_acc > best_acc:
                best_acc = epoch_acc
                best_model_wts = copy.deepcopy(model.state_dict())
    print(f"Training complete in {time.time() - since:.0f}s, best val Acc: {best_acc:4f}")
    model.load_state_dict(best_model_wts)
    return model, history, best_acc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    centers = torch.randn(3, 10) * 2
    def make(n):
        y = torch.randint(0, 3, (n,))
        return torch.utils.data.TensorDataset(centers[y] + torch.randn(n, 10), y)
    datasets = {"train": make(160), "val": make(64)}
    dataloaders = {x: torch.utils.data.DataLoader(datasets[x], batch_size=16, shuffle=True) for x in ["train", "val"]}
    dataset_sizes = {x: len(datasets[x]) for x in ["train", "val"]}
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
    model, history, best_acc = train_model(model, criterion, optimizer, scheduler, dataloaders, dataset_sizes, args.epochs)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), history=history, best=best_acc.item())


if __name__ == "__main__":
    main()
