"""A program whose step loop is a library's that gpusnap knows nothing of (../trainerlib.py).
usage: unknown_trainer.py OUT"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import trainerlib
from common import finish

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(10)]
trainerlib.fit(model, torch.optim.SGD(model.parameters(), lr=0.1), batches, epochs=50)
finish(model=model.state_dict())
