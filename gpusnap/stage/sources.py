"""Where the device memory a snapshot stages comes from: the ranges to fingerprint and copy.

A ``DeviceRange`` is one allocation: its buffer name, device, base, size, kind and owner.
Sources, each asked in the trainee inside the stall, never by a forked writer:

- ``raw_ranges``    what the program allocated itself through cuda-python (``device.tracking``'s
                    registry): always written, restored by call site (``stage.device``);
- ``torch_ranges``  the blocks torch's caching allocator has handed out and not taken back
                    (``torch.cuda.memory._snapshot()``): every CUDA tensor storage is one of
                    them. Written only where the snapshot's object graph holds a storage in
                    them, restored by that object's path (merge);
- ``cupy_ranges``   the memory under every ``cupy.ndarray`` alive in the process (CuPy keeps
                    its pool's bookkeeping to itself, so the arrays are found through the
                    garbage collector, only when the program imported CuPy);
- ``core_ranges``   every open ``cuda.core`` ``Buffer`` of device or managed memory, found
                    through the garbage collector too, only when the program imported
                    cuda.core (its allocations go through Cython, past the raw-allocation
                    wrappers). Buffers over host memory (pinned, or the program's own pages)
                    are no device range: ``stage.unforked`` copies them in the stall. Every
                    open Buffer is noted in ``CORE_BUFFERS`` for the writer, which must not ask
                    a Buffer itself (its properties may call the driver).

Why the allocator and not a walk of the object graph in the stall: a walk costs time per
object (a model with its optimizer is 10^5 of them), the allocator's table costs time per
block, and every storage the graph can reach is in it. The graph is still what decides what is
*written*: the forked writer pickles it and writes the ranges its storages lie in. A block that
no object reaches (a cuBLAS workspace, tensors an autograd graph keeps) is copied in the stall
and not written; ``DeviceStage.unreached`` reports it.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass

from gpusnap.device import tracking
from gpusnap.device.backend import AllocKind


@dataclass(frozen=True)
class DeviceRange:
    """One allocation to stage. ``name`` is its buffer in the store: "raw/<seq>" for a raw
    allocation, "<owner>/cuda<device>/<base hex>/<nbytes>" otherwise (stable for as long as the
    allocation lives in this process, which is what reusing clean chunk ids needs)."""

    name: str
    owner: str  # "raw", "torch", "cupy", "core"
    kind: AllocKind
    device: int
    base: int
    nbytes: int
    allocation: object = None  # the raw allocation's registry entry (device.backend.Allocation)
    segment: int = 0  # base of the driver allocation it lies in (0: its own): copies never span two

    @property
    def unit(self) -> tuple[int, int]:
        """(device, base of the driver allocation it lies in): one copy may cover ranges of one unit."""
        return self.device, self.segment or self.base

    @property
    def always_written(self) -> bool:
        """Raw memory is written whether or not the graph points into it: restore matches it
        by call site, not by path."""
        return self.owner == "raw"


def raw_ranges() -> list[DeviceRange]:
    registry = tracking.registry()
    if registry is None:
        return []
    return [DeviceRange(f"raw/{a.seq}", "raw", a.kind, a.device, a.base, a.nbytes, a) for a in registry.live()]


# device -> bytes torch's allocator holds in reserve (segments less their active blocks) at the
# last ``torch_ranges``: in use on the device, yet no program state.
RESERVED: dict[int, int] = {}


def torch_ranges() -> list[DeviceRange]:
    torch = sys.modules.get("torch")
    RESERVED.clear()
    if torch is None or not torch.cuda.is_initialized():
        return []
    ranges = []
    for segment in torch.cuda.memory._snapshot()["segments"]:
        device = int(segment["device"])
        RESERVED[device] = RESERVED.get(device, 0) + int(segment["total_size"]) - int(segment["active_size"])
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            # requested_size is what the storage asked for; size is rounded up by the allocator.
            nbytes = int(block.get("requested_size") or block["size"])
            base = int(block["address"])
            ranges.append(DeviceRange(owned_name("torch", device, base, nbytes), "torch", AllocKind.DEVICE, device, base,
                                      nbytes, segment=int(segment["address"])))
    return ranges


def cupy_ranges() -> list[DeviceRange]:
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return []
    seen, ranges = set(), []
    for obj in gc.get_objects():
        if type(obj) is not cupy.ndarray:
            continue
        memory = obj.data.mem
        base, nbytes = int(memory.ptr), int(memory.size)
        if not nbytes or base in seen:
            continue
        seen.add(base)
        kind = AllocKind.MANAGED if type(memory).__name__ == "ManagedMemory" else AllocKind.DEVICE
        device = int(memory.device_id)
        ranges.append(DeviceRange(owned_name("cupy", device, base, nbytes), "cupy", kind, device, base, nbytes))
    return ranges


# address -> (device, kind, nbytes) of every open cuda.core Buffer at the last
# ``device_ranges``; kind is "device", "managed", "pinned" (page-locked host memory) or "host".
CORE_BUFFERS: dict[int, tuple[int, str, int]] = {}
HOST_KINDS = ("pinned", "host")


def core_ranges() -> list[DeviceRange]:
    core = sys.modules.get("cuda.core")
    if core is None:
        return []
    classes = {getattr(core, name, None) for name in ("Buffer", "ManagedBuffer")} - {None}
    for obj in gc.get_objects():
        if type(obj) not in classes or obj.is_closed or not obj.size:
            continue
        base, nbytes = int(obj.handle), int(obj.size)
        known = CORE_BUFFERS.get(base)
        if known is not None and known[2] >= nbytes:  # Buffers at one address: the largest holds the others
            continue
        try:
            CORE_BUFFERS[base] = (*_core_place(core, obj), nbytes)
        except Exception:  # noqa: BLE001 - the driver knows no such memory: the pickler fails the snapshot if it matters
            continue
    return [DeviceRange(owned_name("core", device, base, nbytes), "core", AllocKind(kind), device, base, nbytes)
            for base, (device, kind, nbytes) in CORE_BUFFERS.items() if kind not in HOST_KINDS]


def _core_place(core, buffer) -> tuple[int, str]:
    """(device, kind) of an open Buffer; in the trainee only (it may ask the driver)."""
    managed = buffer.is_managed
    if not managed and buffer.is_host_accessible:
        return -1, "pinned" if buffer.is_device_accessible else "host"  # a pinned resource has no device
    device = buffer.device_id
    if device < 0:  # managed memory without a preferred device: staged through the current device
        device = core.Device().device_id
    return device, "managed" if managed else "device"


def core_host_buffers() -> list[tuple[int, int]]:
    """(address, nbytes) of the open cuda.core Buffers over host memory at the last ``device_ranges``."""
    return [(base, nbytes) for base, (_, kind, nbytes) in CORE_BUFFERS.items() if kind in HOST_KINDS]


def owned_name(owner: str, device: int, base: int, nbytes: int) -> str:
    return f"{owner}/cuda{device}/{base:x}/{nbytes}"


SOURCES = (raw_ranges, torch_ranges, cupy_ranges, core_ranges)


def device_ranges() -> list[DeviceRange]:
    """Every range of every source, each address once (a raw allocation that torch also
    reports, through a pluggable allocator, is the raw one; so is one a cuda.core Buffer wraps)."""
    CORE_BUFFERS.clear()
    ranges: list[DeviceRange] = []
    taken: set[tuple[int, int]] = set()
    for source in SOURCES:
        for r in source():
            if (r.device, r.base) not in taken:
                taken.add((r.device, r.base))
                ranges.append(r)
    return ranges
