"""cuda.core Buffers (device, managed and pinned host memory) computed in on a GPU, state held
only there: OUT STEPS. Run with GPUSNAP_DEVICE=fake under gpusnap (no GPU needed) or on a real GPU.

Each step copies the device buffer into a pinned one, computes on the host, and copies it back
on the program's stream without waiting, so a snapshot that does not synchronize the device
stages stale bytes; a second pinned buffer keeps running totals that live nowhere else; the
managed buffer changes its first words only. The loop's locals hold Buffers only (no NumPy view
of their memory), so what the snapshot holds of that memory comes through the Buffers. Buffers
made during training: from step 3, every 7th step keeps a copy of the weights in
``state["best"]`` (made by ``copy_to``) and the previous copy, closed, in ``state["retired"]``.
TEST_CORECUDA_DEV_BYTES sizes the device buffer."""

import ctypes
import hashlib
import os
import sys

import numpy as np
from cuda.core import Device, LegacyPinnedMemoryResource, ManagedMemoryResource
from pace import OUT, finish, progress

DEV_BYTES = int(os.environ.get("TEST_CORECUDA_DEV_BYTES", 256 << 10))
MANAGED_BYTES = 128 << 10
TOTALS_BYTES = 4 << 10


def words(buffer) -> np.ndarray:
    """The words of a host-accessible Buffer (pinned or managed memory), in place."""
    return np.ctypeslib.as_array((ctypes.c_uint32 * (buffer.size // 4)).from_address(buffer.handle))


def compute(pinned, totals, managed, step: int) -> None:
    """On the host: the weights (copied into ``pinned``), the totals, the managed buffer's first words."""
    weights, sums = words(pinned), words(totals)
    weights[:] = weights * np.uint32(31) + np.uint32(step)
    sums[:] += weights[: sums.size] ^ np.uint32(step)
    words(managed)[:16] += np.uint32(step)


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()


def main(steps: int) -> None:
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    weights = device.allocate(DEV_BYTES, stream=stream)
    managed = ManagedMemoryResource().allocate(MANAGED_BYTES, stream=stream)
    pinned = LegacyPinnedMemoryResource().allocate(DEV_BYTES)
    totals = LegacyPinnedMemoryResource().allocate(TOTALS_BYTES)
    with open(os.path.join(OUT, "bases"), "a") as f:
        f.write(f"{weights.handle:#x} {managed.handle:#x} {pinned.handle:#x} {totals.handle:#x}\n")
    weights.fill(1, stream=stream)  # waited for by the first step
    words(managed)[:] = 7
    words(totals)[:] = 0
    state = {"weights": weights}
    for step in range(steps):
        stream.sync()  # the last step's work, before reading its result
        weights.copy_to(pinned, stream=stream)
        stream.sync()
        compute(pinned, totals, managed, step)
        weights.copy_from(pinned, stream=stream)
        if step >= 3 and step % 7 == 3:
            if "best" in state:
                state["best"].close(stream=stream)
                state["retired"] = state["best"]
            state["best"] = weights.copy_to(stream=stream)
        progress(step + 1)

    stream.sync()
    digests = {"totals": digest(words(totals)), "managed": digest(words(managed))}
    for name in ("weights", "best"):
        state[name].copy_to(pinned, stream=stream)
        stream.sync()
        digests[name] = digest(words(pinned))
    finish(digests=digests, retired_closed=state["retired"].is_closed, head=words(totals)[:4].tolist())


if __name__ == "__main__":
    main(int(sys.argv[2]))
