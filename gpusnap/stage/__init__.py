"""Pipeline step 4: quiesce the devices and stage device memory into host memory.

This is the only step besides fork that stalls training. Its interface, in call order:

1. ``quiesce()``  — wait until every device the program uses is idle (torch.cuda.synchronize).
2. ``stage() -> dict``  — copy what changed since the last snapshot off the devices; returns
   {(device type, address, nbytes): host memoryview} for the pickler to read instead of the
   device pointer. The views must stay valid in the forked writer (MAP_SHARED, registered once).

CPU mode (what this module implements today) has nothing to stage: the fork itself gives the
writer a consistent copy of host memory. A device storage met by the pickler without a staged
copy fails the snapshot with a ``CaptureError`` (restoring replayed device tensors would be a
silent partial restore).
"""

from __future__ import annotations

import sys


def quiesce() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        for device in range(torch.cuda.device_count()):
            torch.cuda.synchronize(device)


def stage() -> dict:
    return {}
