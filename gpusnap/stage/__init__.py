"""Pipeline step 4: quiesce the devices and stage device memory into host memory.

This is the only step besides fork that stalls training. Its interface, in call order:

1. ``quiesce()``  — wait until every device the program uses is idle (torch.cuda.synchronize).
2. ``stage() -> dict``  — copy what changed since the last snapshot off the devices; returns
   {(device type, address, nbytes): host memoryview} for the pickler to read instead of the
   device pointer. The views must stay valid in the forked writer (MAP_SHARED, registered once).

CPU mode (what this package implements today) stages nothing in the stall: the fork itself gives
the writer a consistent copy of host memory. What it adds is after the fork: the writer *drains*
large CPU tensors into the staging pool (``pool``), which both the trainee and its writers map,
so that the trainee's next writes to them are not copy-on-write copies (``drain``); between
snapshots, the trainee readies the pool and collapses those tensors into huge pages
(``prepare``, ``hugepages``). A device storage met by the pickler without a staged copy fails
the snapshot with a ``CaptureError`` (restoring replayed device tensors would be a silent
partial restore); so that this is known before the fork, ``unstaged_device_memory()`` refuses
the snapshot in the parent when the program holds device memory that nothing stages.
"""

from __future__ import annotations

import sys

from gpusnap.stage.pool import host_pool  # noqa: F401  (the trainee's staging pool, created on first use)
from gpusnap.stage.prepare import prepare, writer_done, writer_starting  # noqa: F401  (between snapshots)


def quiesce() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            torch.cuda.synchronize(device)


def stage() -> dict:
    return {}


def unstaged_device_memory() -> str | None:
    """Why a snapshot cannot be taken, when the program holds CUDA memory that this build does
    not stage (asked in the parent, before the fork; training goes on)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    held = {device: torch.cuda.memory_allocated(device) for device in range(torch.cuda.device_count())}
    held = {device: nbytes for device, nbytes in held.items() if nbytes}
    if not held:
        return None
    where = ", ".join(f"cuda:{device} {nbytes:,} bytes" for device, nbytes in held.items())
    return f"the program holds CUDA memory ({where}), which this version of gpusnap cannot stage yet"
