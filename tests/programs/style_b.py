"""(b) the loop inside main() -> train_epoch(), with locals carried across iterations: an RNN
hidden state, a running total, a list of losses, and a closure cell. usage: style_b.py OUT EPOCHS"""
import sys

import torch
from common import finish, progress


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.RNN(6, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x, hidden):
        out, hidden = self.rnn(x, hidden)
        return self.head(out[:, -1]), hidden


def train_epoch(model, optimizer, data, hidden, history, step, on_step):
    running_total = 0.0
    for i in range(len(data)):
        x, y = data[i]
        hidden = hidden.detach()
        pred, hidden = model(x, hidden)
        loss = torch.nn.functional.mse_loss(pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running_total += loss.item()
        history.append(running_total)
        on_step(loss.item())
        step += 1
        progress(step)
    return hidden, running_total, step


def main():
    torch.manual_seed(1)
    epochs = int(sys.argv[2])
    data = [(torch.randn(4, 5, 6), torch.randn(4, 1)) for _ in range(20)]
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    hidden = torch.zeros(1, 4, 16)
    history, totals = [], []
    step = 0
    worst = 0.0  # a cell: on_step rebinds it

    def on_step(loss):
        nonlocal worst
        worst = max(worst, loss)

    for epoch in range(epochs):
        hidden, total, step = train_epoch(model, optimizer, data, hidden, history, step, on_step)
        totals.append(total)
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), hidden=hidden, history=history, totals=totals, worst=worst)


if __name__ == "__main__":
    main()
