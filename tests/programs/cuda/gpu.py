"""What the CUDA programs share: the device they train on, chosen as scripts choose it (the GPU
when there is one), and deterministic algorithms."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from common import finish, progress  # noqa: E402,F401

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
torch.use_deterministic_algorithms(True)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_cpu(tree):
    """``tree`` (tensors in dicts and lists) with every tensor copied to the CPU, for finish()."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: on_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [on_cpu(v) for v in tree]
    return tree
