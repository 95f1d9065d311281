"""The one interface between gpusnap and a GPU: ``GpuBackend``, and the data it speaks in.

Staging, dirty tracking and restore are written against this interface only, so the same code
runs on a real GPU (``cuda.CudaBackend``) and in CI (``fake.FakeBackend``). Every method runs
in the trainee; a forked writer must never call one (the fake refuses, as CUDA does).
The order in which its methods are called is on ``GpuBackend``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass


# A wrapper that tracks a cuda-python allocation function keeps the function it wraps under
# this attribute; backends call through it so gpusnap's own allocations are never tracked.
ORIGINAL_ATTR = "__gpusnap_original__"


class AllocKind(str, enum.Enum):
    DEVICE = "device"  # cuMemAlloc*, cudaMalloc*, stream-ordered pools: device memory only
    MANAGED = "managed"  # cuMemAllocManaged / cudaMallocManaged: UVM, host-visible in the trainee
    VMM = "vmm"  # cuMemCreate + cuMemMap into a cuMemAddressReserve range


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    capability: tuple[int, int]  # (major, minor), e.g. (9, 0) for an H100
    total_bytes: int
    uuid: str  # hex, stable across restarts on the same GPU; "" where unknown

    @property
    def arch(self) -> str:
        """The architecture NVRTC compiles for, e.g. "sm_90"."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class PointerInfo:
    """What the driver says about an address: the allocation that contains it."""

    kind: AllocKind
    device: int  # ordinal; for managed memory, the device it was allocated from (the current one where the driver names none)
    base: int
    nbytes: int


@dataclass(frozen=True)
class Allocation:
    """A registry entry: one raw allocation made through a tracked cuda-python function.

    Restore matches entries by (call_site, ordinal, nbytes, kind), never by address: ``base``
    is only valid in the process that made it.
    """

    seq: int  # 0, 1, 2, ... in the order the program allocated
    call_site: str  # "path/to/file.py:LINE" of the program's call
    ordinal: int  # how many allocations this call site made before this one
    kind: AllocKind
    device: int
    base: int
    nbytes: int
    api: str  # the function the program called, e.g. "cuMemAlloc" or "cudaMallocManaged"


class GpuBackend(ABC):
    """One GPU API, as staging, dirty tracking and restore need it.

    Order of calls in a run::

        devices_in_use()                      which devices the program has contexts on (creates none)
        device(ordinal)                       name, capability, memory: for the manifest, the device map
        register_host(address, nbytes)        the staging arena, once (slow: ~1-2 GB/s)
        per snapshot, after the program's own work is done:
            synchronize(ordinal)              each device in use
            pointer(address)                  kind, device, allocation range of a buffer to stage
            fingerprint_ranges(ordinal, ranges, chunk_bytes)      every range of a device, one launch
            synchronize(ordinal)              fingerprints are readable now; compare, pick dirty chunks
            copy_to_host(ordinal, ptr, dst, nbytes)               per dirty run, on the backend's stream
            synchronize(ordinal)              the staged bytes are in the arena: fork the writer
            memory_used(ordinal)              for the manifest: what no tracked allocation accounts for
        on restore:
            copy_to_device(ordinal, ptr, src, nbytes); synchronize(ordinal)
        close()                               unregisters host memory, drops streams and modules

    Asynchronous methods only *enqueue* work on the backend's own stream of that device; nothing
    they write may be read before ``synchronize`` of that device returns.
    """

    name: str = "abstract"

    @abstractmethod
    def device_count(self) -> int:
        """Devices visible to the process (CUDA_VISIBLE_DEVICES applies)."""

    @abstractmethod
    def devices_in_use(self) -> list[int]:
        """Ordinals of the devices whose primary context is active: the program has used them.
        Never creates a context on a device the program has not touched."""

    @abstractmethod
    def device(self, ordinal: int) -> DeviceInfo: ...

    @abstractmethod
    def pointer(self, address: int) -> PointerInfo:
        """The allocation containing ``address``; ``CudaCallFailed`` if none does."""

    @abstractmethod
    def register_host(self, address: int, nbytes: int) -> None:
        """Page-lock a host range (cuMemHostRegister, portable) so copies into it are DMA."""

    @abstractmethod
    def unregister_host(self, address: int) -> None: ...

    @abstractmethod
    def copy_to_host(self, ordinal: int, src: int, dst_address: int, nbytes: int) -> None:
        """Enqueue device (or managed) ``src`` -> host ``dst_address``."""

    @abstractmethod
    def copy_to_device(self, ordinal: int, dst: int, src_address: int, nbytes: int) -> None:
        """Enqueue host ``src_address`` -> device (or managed) ``dst``."""

    @abstractmethod
    def fingerprint(self, ordinal: int, src: int, nbytes: int, chunk_bytes: int, out) -> None:
        """Enqueue the fingerprints (``fingerprint.py``) of every chunk of ``nbytes`` at ``src``
        into ``out``: a writable host buffer of at least chunks * 16 bytes."""

    @abstractmethod
    def fingerprint_ranges(self, ordinal: int, ranges: list, chunk_bytes: int):
        """Enqueue the fingerprints of every chunk of every (src, nbytes) in ``ranges``, each
        cut from its own start; returns a uint8 array (chunks of all ranges in order, 16), which
        holds them once ``synchronize`` of ``ordinal`` returns."""

    @abstractmethod
    def synchronize(self, ordinal: int) -> None:
        """Wait until the work the backend enqueued on ``ordinal`` has finished."""

    @abstractmethod
    def managed_view(self, address: int, nbytes: int) -> memoryview:
        """Host view of managed memory, valid in the trainee only (a forked child faults on it):
        the parent reads it after synchronize, or copies it with ``copy_to_host``."""

    @abstractmethod
    def memory_used(self, ordinal: int) -> int:
        """Device memory in use on ``ordinal`` (the driver's total minus free), less what this
        backend allocated itself: what the program holds, tracked or not."""

    @abstractmethod
    def close(self) -> None: ...
