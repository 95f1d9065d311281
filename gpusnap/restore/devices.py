"""Where restored device tensors go: the device map.

A snapshot's device tensors load as CPU tensors (``graph.load``). Where the replayed program
holds a tensor at the same place, the merge copies the bytes into it, on whatever device the
replay put it: another GPU, a machine with fewer GPUs, or the CPU when the program chose the CPU
(``device = "cuda" if torch.cuda.is_available() else "cpu"``). What the replay does not hold (a
tensor made during training, an object adopted from the snapshot) is placed here, after the
merge, on the device the map gives (``graph.devicemap``).

A tensor moves with ``set_`` onto its new storage, so the object, its identity, its views (one
new storage per old one) and its autograd leaf status stay what the merge left.
"""

from __future__ import annotations

import sys

from gpusnap.graph.devicemap import target


def place(aligned: dict, device_tensors: list) -> dict:
    """Move the device tensors that no live tensor took the bytes of onto the mapped device;
    ``aligned`` is the merge's {id(snapshot object): what stands for it}. Returns {saved
    device: where its tensors went} for the ones moved or kept on the CPU."""
    torch = sys.modules["torch"]
    moved: dict[int, object] = {}  # address of the loaded CPU storage -> its new storage
    placed: dict[str, str] = {}
    for tensor, saved in device_tensors:
        if aligned.get(id(tensor), tensor) is not tensor:
            continue  # merged into a live tensor: its bytes are where the replay wants them
        where = placed.get(saved) or target(saved)
        placed[saved] = where
        if where == "cpu":
            continue
        storage = tensor.untyped_storage()
        new = moved.get(storage.data_ptr())
        if new is None:
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)
            new = moved[storage.data_ptr()] = whole.to(where).untyped_storage()
        with torch.no_grad():
            tensor.set_(new, tensor.storage_offset(), tensor.size(), tensor.stride())
    return placed
