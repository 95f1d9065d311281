"""The fake GPU's state: devices, contexts, streams and memory of one process.

It is strict where a real GPU would punish a bug that CI could otherwise never see:

- Device memory lives at a random base per process (a PROT_NONE reservation; the bytes sit in a
  separate do-not-fork backing), so pointers change across restarts and a host dereference of
  a device pointer faults, as it does on a GPU; ``GPUSNAP_FAKE_BASES=repeat`` gives every
  process the same bases instead, as a real GPU often does.
- Stream work runs only when something waits for it (a synchronize of its stream, event or
  context, a synchronous call that waits for it), and then in an order CUDA allows, picked at
  random from a logged seed (``streams.py``): a non-blocking stream may overtake earlier
  legacy-stream work unless an event orders them. Reading a copy's destination before
  synchronize sees the old bytes. The documented behaviour of pageable host memory holds: a
  device->host copy into pageable memory completes before the call returns; a host->device copy
  from pageable memory takes the source bytes at the call, and a synchronous one (like a
  synchronous memset of device memory) may still be in flight when it returns. Into or from
  registered (pinned) memory, nothing happens before synchronize.
- Registered host memory is pinned by page, not by address (``pinning.py``): a page replaced
  under a registration (a hole punched in the file it maps) takes no more copies.
- Managed memory is host memory at its own address, marked do-not-fork: a forked child that
  touches it dies of SIGSEGV (a real child cannot use UVM either).
- Registered host ranges, and the pinned host memory it allocates (``alloc_pinned``), are
  marked do-not-fork too, as CUDA may mark pinned memory: a writer must map the staging memfd
  afresh instead of trusting the inherited mapping, and never reads pinned memory in place.
- After fork, every call in the child fails with CUDA_ERROR_NOT_INITIALIZED.
- An operation that meets freed or unmapped memory when it runs leaves the context with a
  sticky CUDA_ERROR_ILLEGAL_ADDRESS, as a faulting kernel does.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import threading
from dataclasses import dataclass, field

from gpusnap import knobs
from gpusnap import rawmem
from gpusnap.device.backend import AllocKind
from gpusnap.device.fake import pinning, streams
from gpusnap.device.fake.streams import CudaFault  # noqa: F401  (the fake modules' failure, raised here)

ALIGN = 512  # cuMemAlloc's alignment on current GPUs (the documented minimum is 256)
VMM_GRANULARITY = 2 << 20  # cuMemGetAllocationGranularity on current GPUs
STREAM_LEGACY = 0x1  # CU_STREAM_LEGACY
STREAM_PER_THREAD = 0x2  # CU_STREAM_PER_THREAD
STREAM_NON_BLOCKING = 0x1  # CU_STREAM_NON_BLOCKING flag of cuStreamCreate


class _Heap:
    """First-fit allocator of offsets in [0, nbytes)."""

    def __init__(self, nbytes: int):
        self.free = [(0, nbytes)]

    def take(self, nbytes: int, align: int) -> int:
        for i, (start, length) in enumerate(self.free):
            at = -(-start // align) * align
            if at + nbytes <= start + length:
                rest = [(s, n) for s, n in ((start, at - start), (at + nbytes, start + length - at - nbytes)) if n]
                self.free[i : i + 1] = rest
                return at
        raise CudaFault("CUDA_ERROR_OUT_OF_MEMORY")

    def give(self, offset: int, nbytes: int) -> None:
        bisect.insort(self.free, (offset, nbytes))
        merged = []
        for start, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self.free = merged


@dataclass
class Alloc:
    """A device-visible range: ``backing`` is where its bytes are in this process."""

    base: int
    nbytes: int
    kind: AllocKind
    device: int  # for managed memory that prefers the host, -1 (as the driver names its device)
    backing: int
    accessible: bool = True  # VMM mappings: only after cuMemSetAccess
    handle: int = 0  # VMM: the physical allocation mapped here
    ctx: int = 0  # device memory: the context it belongs to, whose kernels alone may touch it


@dataclass
class Physical:
    """A cuMemCreate handle: memory without an address until cuMemMap."""

    handle: int
    device: int
    nbytes: int
    backing: int
    mappings: int = 0
    refs: int = 1  # cuMemCreate's reference, plus one per cuMemRetainAllocationHandle


@dataclass
class Stream:
    handle: int
    ctx: Context
    blocking: bool
    pending: list = field(default_factory=list)  # streams.Op, in the order they were enqueued


@dataclass
class Event:
    handle: int
    marker: streams.Op | None = None  # the op that completes it, while pending
    done: bool = True  # never recorded counts as complete, as in CUDA


@dataclass
class Context:
    handle: int
    device: int
    primary: bool
    streams: dict = field(default_factory=dict)  # handle -> Stream
    legacy: Stream | None = None
    error: str | None = None  # sticky, as after a device fault


@dataclass
class Device:
    ordinal: int
    name: str
    capability: tuple[int, int]
    total_bytes: int
    va_base: int
    heap: _Heap
    primary: Context
    primary_refs: int = 0
    used_bytes: int = 0


class Machine:
    """One process's fake GPUs. Built by cuInit in the process that first calls it."""

    def __init__(self, devices: int, device_bytes: int, seed: int | None = None):
        self.pid = os.getpid()
        self._next_handle = 0x5000
        self.work = streams.Work(streams.chosen_seed() if seed is None else seed)
        self.devices: list[Device] = []
        self.contexts: dict[int, Context] = {}
        self.streams: dict[int, Stream] = {}
        self.events: dict[int, Event] = {}
        self.allocs: dict[int, Alloc] = {}
        self._bases: list[int] = []
        self.physical: dict[int, Physical] = {}
        self.reservations: dict[int, int] = {}  # VMM address reservations: base -> nbytes
        self.registered: dict[int, pinning.Registration] = {}  # by host address
        self.pinned_allocs: dict[int, int] = {}  # cuMemAllocHost's: address -> nbytes (registered too)
        self.tls = threading.local()  # per thread: the context stack, the runtime's device
        self.runtime_devices: set[int] = set()  # primary contexts the runtime has retained
        self.device_bytes = device_bytes
        for ordinal in range(devices):
            ctx = self._context(ordinal, primary=True)
            va = rawmem.reserve_random(device_bytes, repeat=knobs.FAKE_BASES == "repeat")
            name = f"gpusnap fake device {ordinal}"
            self.devices.append(Device(ordinal, name, (9, 0), device_bytes, va, _Heap(device_bytes), ctx))
        self.managed_base = rawmem.reserve_random(device_bytes * max(1, devices), repeat=knobs.FAKE_BASES == "repeat")
        self.managed_heap = _Heap(device_bytes * max(1, devices))

    # ---- handles, contexts, streams

    def new_handle(self) -> int:
        self._next_handle += 0x10
        return self._next_handle

    def _context(self, device: int, primary: bool) -> Context:
        ctx = Context(self.new_handle(), device, primary)
        ctx.legacy = Stream(0, ctx, blocking=True)
        self.contexts[ctx.handle] = ctx
        return ctx

    def create_context(self, device: int) -> Context:
        return self._context(self.device(device).ordinal, primary=False)

    def device(self, ordinal: int) -> Device:
        if not 0 <= int(ordinal) < len(self.devices):
            raise CudaFault("CUDA_ERROR_INVALID_DEVICE")
        return self.devices[int(ordinal)]

    def stack(self) -> list[Context]:
        if not hasattr(self.tls, "stack"):
            self.tls.stack = []
        return self.tls.stack

    def current(self) -> Context:
        """The calling thread's current context; its sticky error fails every call."""
        stack = self.stack()
        if not stack:
            raise CudaFault("CUDA_ERROR_INVALID_CONTEXT")
        ctx = stack[-1]
        if ctx.error:
            raise CudaFault(ctx.error)
        return ctx

    def context(self, handle: int) -> Context:
        ctx = self.contexts.get(int(handle))
        if ctx is None:
            raise CudaFault("CUDA_ERROR_INVALID_CONTEXT")
        return ctx

    def new_stream(self, blocking: bool, ctx: Context | None = None) -> Stream:
        """A stream of ``ctx`` (default: the calling thread's current context)."""
        ctx = ctx or self.current()
        stream = Stream(self.new_handle(), ctx, blocking)
        ctx.streams[stream.handle] = stream
        self.streams[stream.handle] = stream
        return stream

    def stream(self, handle) -> Stream:
        h = int(handle)
        if h in (0, STREAM_LEGACY, STREAM_PER_THREAD):
            return self.current().legacy
        stream = self.streams.get(h)
        if stream is None:
            raise CudaFault("CUDA_ERROR_INVALID_HANDLE")
        if stream.ctx.error:
            raise CudaFault(stream.ctx.error)
        return stream

    def destroy_stream(self, handle) -> None:
        stream = self.stream(handle)
        if stream.handle == 0:
            raise CudaFault("CUDA_ERROR_INVALID_HANDLE")
        # Work already enqueued still completes (the driver defers the destruction).
        self.work.stream(stream)
        del stream.ctx.streams[stream.handle]
        del self.streams[stream.handle]

    # ---- work, run only when something waits for it (streams.py: in what order)

    def enqueue(self, stream: Stream, op, after=()) -> streams.Op:
        return self.work.enqueue(stream, op, after)

    def complete(self, op: streams.Op) -> None:
        """Wait for one op (and what it follows), as a synchronous call waits for its own work."""
        self.work.complete([op])

    def record(self, event: Event, stream: Stream) -> None:
        def mark():
            if event.marker is marker:  # a later record moved the event on
                event.done = True

        marker = self.work.enqueue(stream, mark)
        event.marker, event.done = marker, False

    def wait_event(self, event: Event) -> None:
        """Run the event's stream up to its marker (the work the event stands for)."""
        if not event.done and event.marker is not None:
            self.work.complete([event.marker])

    def event_op(self, event: Event) -> list:
        """What a stream that waits for ``event`` must follow: its marker, while pending."""
        return [] if event.done or event.marker is None else [event.marker.seq]

    def sync_stream(self, stream: Stream) -> None:
        self.work.stream(stream)

    def sync_legacy(self, ctx: Context) -> None:
        self.work.legacy(ctx)

    def sync_context(self, ctx: Context) -> None:
        self.work.context(ctx)

    # ---- memory

    def _add(self, alloc: Alloc) -> Alloc:
        self.allocs[alloc.base] = alloc
        bisect.insort(self._bases, alloc.base)
        return alloc

    def _remove(self, base: int) -> Alloc:
        alloc = self.allocs.pop(base)
        self._bases.remove(base)
        return alloc

    def find(self, address: int) -> Alloc | None:
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        alloc = self.allocs[self._bases[i]]
        return alloc if address < alloc.base + alloc.nbytes else None

    def alloc_device(self, nbytes: int, device: int, ctx: Context | None = None) -> Alloc:
        """Device memory of ``ctx`` (default: the device's primary context)."""
        if nbytes <= 0:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        dev = self.device(device)
        if dev.used_bytes + nbytes > dev.total_bytes:
            raise CudaFault("CUDA_ERROR_OUT_OF_MEMORY")
        offset = dev.heap.take(nbytes, ALIGN)
        backing = _host_pages(nbytes)
        dev.used_bytes += nbytes
        owner = (ctx or dev.primary).handle
        return self._add(Alloc(dev.va_base + offset, nbytes, AllocKind.DEVICE, device, backing, ctx=owner))

    def alloc_managed(self, nbytes: int, device: int) -> Alloc:
        if nbytes <= 0:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        # Page-aligned, so each managed allocation owns its pages and its do-not-fork flag.
        offset = self.managed_heap.take(rawmem.page_up(nbytes), rawmem.PAGE)
        base = self.managed_base + offset
        rawmem.map_over(base, nbytes, rawmem.PROT_RW)
        rawmem.madvise(base, rawmem.page_up(nbytes), rawmem.MADV_DONTFORK)
        return self._add(Alloc(base, nbytes, AllocKind.MANAGED, device, base))

    def free(self, address: int) -> None:
        alloc = self.allocs.get(int(address))
        if alloc is None or alloc.kind is AllocKind.VMM:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        self._remove(alloc.base)
        if alloc.kind is AllocKind.MANAGED:
            rawmem.map_over(alloc.base, alloc.nbytes, rawmem.PROT_NONE)
            self.managed_heap.give(alloc.base - self.managed_base, rawmem.page_up(alloc.nbytes))
        else:
            dev = self.devices[alloc.device]
            rawmem.unmap(alloc.backing, alloc.nbytes)
            dev.heap.give(alloc.base - dev.va_base, alloc.nbytes)
            dev.used_bytes -= alloc.nbytes

    def resolve(self, address: int, nbytes: int, status: str = "CUDA_ERROR_INVALID_VALUE") -> int | None:
        """Host address of [address, address + nbytes) if it is device-visible memory, None
        if it is not (a host pointer); ``status`` if it straddles or leaves an allocation."""
        alloc = self.find(address)
        if alloc is None:
            if self.in_device_space(address):
                raise CudaFault(status)  # freed, unmapped, or never allocated
            return None
        if not alloc.accessible or address + nbytes > alloc.base + alloc.nbytes:
            raise CudaFault(status)
        return alloc.backing + (address - alloc.base)

    def in_device_space(self, address: int) -> bool:
        spaces = [(d.va_base, d.total_bytes) for d in self.devices]
        spaces.append((self.managed_base, self.device_bytes * max(1, len(self.devices))))
        spaces += self.reservations.items()
        return any(base <= address < base + nbytes for base, nbytes in spaces)

    def device_address(self, address: int, nbytes: int, status: str = "CUDA_ERROR_INVALID_VALUE") -> int:
        host = self.resolve(address, nbytes, status)
        if host is None:
            raise CudaFault(status)
        return host

    def kernel_address(self, address: int, nbytes: int, ctx: Context) -> int:
        """What a kernel of ``ctx`` reads at ``address``: a context's kernels cannot reach device
        memory of another context (each has its own GPU address space; copies can, through
        unified addressing), and trying faults the launching context."""
        alloc = self.find(address)
        if alloc is not None and alloc.ctx and alloc.ctx != ctx.handle:
            raise CudaFault("CUDA_ERROR_ILLEGAL_ADDRESS")
        return self.device_address(address, nbytes, "CUDA_ERROR_ILLEGAL_ADDRESS")

    def registration(self, address: int, nbytes: int) -> pinning.Registration | None:
        """The registration that holds all of [address, address + nbytes), if one does."""
        for reg in self.registered.values():
            if reg.address <= address and address + nbytes <= reg.address + reg.nbytes:
                return reg
        return None

    def pinned(self, address: int, nbytes: int) -> bool:
        return self.registration(address, nbytes) is not None

    def to_host(self, address: int, source: int, nbytes: int) -> None:
        """A DMA write into host memory: into the pages a registration pinned, if any."""
        reg = self.registration(address, nbytes)
        if reg is None:
            ctypes.memmove(address, source, nbytes)
        else:
            reg.copy_in(address, source, nbytes)

    def from_host(self, dest: int, address: int, nbytes: int) -> None:
        """A DMA read of host memory: from the pages a registration pinned, if any."""
        reg = self.registration(address, nbytes)
        if reg is None:
            ctypes.memmove(dest, address, nbytes)
        else:
            reg.copy_out(dest, address, nbytes)

    # ---- VMM

    def reserve(self, nbytes: int, hint: int) -> int:
        if nbytes <= 0 or nbytes % VMM_GRANULARITY or hint % VMM_GRANULARITY:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        # The driver grants the requested address when it is free; so does the fake.
        base = rawmem.map_exactly(hint, nbytes, rawmem.PROT_NONE) if hint else None
        base = base or rawmem.reserve_random(nbytes, VMM_GRANULARITY, repeat=knobs.FAKE_BASES == "repeat")
        self.reservations[base] = nbytes
        return base

    def unreserve(self, base: int, nbytes: int) -> None:
        if self.reservations.get(base) != nbytes:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        if any(base <= a.base < base + nbytes for a in self.allocs.values()):
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")  # still mapped
        del self.reservations[base]
        rawmem.unmap(base, nbytes)

    def create_physical(self, nbytes: int, device: int) -> Physical:
        dev = self.device(device)
        if nbytes <= 0 or nbytes % VMM_GRANULARITY:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        if dev.used_bytes + nbytes > dev.total_bytes:
            raise CudaFault("CUDA_ERROR_OUT_OF_MEMORY")
        backing = _host_pages(nbytes)
        dev.used_bytes += nbytes
        phys = Physical(self.new_handle(), device, nbytes, backing)
        self.physical[phys.handle] = phys
        return phys

    def _drop_physical(self, phys: Physical) -> None:
        if phys.refs <= 0 and not phys.mappings:
            del self.physical[phys.handle]
            rawmem.unmap(phys.backing, phys.nbytes)
            self.devices[phys.device].used_bytes -= phys.nbytes

    def release_physical(self, handle: int) -> None:
        phys = self.physical.get(int(handle))
        if phys is None or phys.refs <= 0:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        phys.refs -= 1  # freed once its last mapping goes too, as the driver does
        self._drop_physical(phys)

    def map(self, address: int, nbytes: int, offset: int, handle: int) -> None:
        phys = self.physical.get(int(handle))
        inside = any(b <= address and address + nbytes <= b + n for b, n in self.reservations.items())
        if phys is None or phys.refs <= 0 or not inside or offset + nbytes > phys.nbytes:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        if nbytes % VMM_GRANULARITY or address % VMM_GRANULARITY or offset % VMM_GRANULARITY:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        if self.find(address) or self.find(address + nbytes - 1):
            raise CudaFault("CUDA_ERROR_ALREADY_MAPPED")
        phys.mappings += 1
        self._add(Alloc(address, nbytes, AllocKind.VMM, phys.device, phys.backing + offset, False, phys.handle))

    def unmap(self, address: int, nbytes: int) -> None:
        alloc = self.allocs.get(address)
        if alloc is None or alloc.kind is not AllocKind.VMM or alloc.nbytes != nbytes:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        self._remove(address)
        phys = self.physical[alloc.handle]
        phys.mappings -= 1
        self._drop_physical(phys)

    def set_access(self, address: int, nbytes: int) -> None:
        hit = [a for a in self.allocs.values() if a.kind is AllocKind.VMM and address <= a.base < address + nbytes]
        if not hit:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        for alloc in hit:
            alloc.accessible = True

    # ---- host registration

    def register(self, address: int, nbytes: int) -> None:
        if nbytes <= 0 or address == 0:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        for reg in self.registered.values():
            if reg.address < address + nbytes and address < reg.address + reg.nbytes:
                raise CudaFault("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED")
        try:
            rawmem.madvise(address, nbytes, rawmem.MADV_DONTFORK)
        except OSError as exc:  # part of the range is not mapped
            raise CudaFault("CUDA_ERROR_INVALID_VALUE") from exc
        self.registered[address] = pinning.Registration(address, nbytes)

    def unregister(self, address: int) -> None:
        reg = self.registered.pop(address, None)
        if reg is None:
            raise CudaFault("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED")
        reg.close()
        rawmem.madvise(address, reg.nbytes, rawmem.MADV_DOFORK)

    def alloc_pinned(self, nbytes: int) -> int:
        """Page-locked host memory (cuMemAllocHost): host pages, registered, so do-not-fork and
        stream-ordered in copies, as CUDA's own are."""
        if nbytes <= 0:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        try:  # shared, so that its registration models its pages (pinning.py)
            address = rawmem.map_anywhere(nbytes, shared=True)
        except OSError as exc:
            raise CudaFault("CUDA_ERROR_OUT_OF_MEMORY") from exc
        self.register(address, rawmem.page_up(nbytes))
        self.pinned_allocs[address] = nbytes
        return address

    def free_pinned(self, address: int) -> None:
        nbytes = self.pinned_allocs.pop(int(address), None)
        if nbytes is None:
            raise CudaFault("CUDA_ERROR_INVALID_VALUE")
        self.unregister(int(address))
        rawmem.unmap(int(address), nbytes)

    def close(self) -> None:
        """Give every mapping back (tests build many machines in one process)."""
        for alloc in list(self.allocs.values()):
            if alloc.kind is AllocKind.DEVICE:
                rawmem.unmap(alloc.backing, alloc.nbytes)
        for phys in self.physical.values():
            rawmem.unmap(phys.backing, phys.nbytes)
        for address, reg in self.registered.items():
            reg.close()
            try:
                rawmem.madvise(address, reg.nbytes, rawmem.MADV_DOFORK)
            except OSError:
                pass  # the program unmapped it while registered; nothing left to undo
        for address, nbytes in self.pinned_allocs.items():
            rawmem.unmap(address, nbytes)
        for base, nbytes in self.reservations.items():
            rawmem.unmap(base, nbytes)
        for dev in self.devices:
            rawmem.unmap(dev.va_base, dev.total_bytes)
        rawmem.unmap(self.managed_base, self.device_bytes * max(1, len(self.devices)))
        self.allocs.clear()
        self.physical.clear()
        self.registered.clear()
        self.pinned_allocs.clear()


def _host_pages(nbytes: int) -> int:
    """Do-not-fork host pages for device bytes; the host running out is the device running out."""
    try:
        backing = rawmem.map_anywhere(nbytes)
    except OSError as exc:
        raise CudaFault("CUDA_ERROR_OUT_OF_MEMORY") from exc
    rawmem.madvise(backing, rawmem.page_up(nbytes), rawmem.MADV_DONTFORK)
    return backing


_machine: Machine | None = None


def machine() -> Machine:
    """This process's machine. A forked child never gets one: it inherits its parent's, and
    every call there fails as a real driver's does."""
    if _machine is None:
        raise CudaFault("CUDA_ERROR_NOT_INITIALIZED")
    if _machine.pid != os.getpid():
        raise CudaFault("CUDA_ERROR_NOT_INITIALIZED")
    return _machine


def init() -> Machine:
    global _machine
    if _machine is not None and _machine.pid != os.getpid():
        raise CudaFault("CUDA_ERROR_NOT_INITIALIZED")
    if _machine is None:
        _machine = Machine(knobs.FAKE_DEVICES, knobs.FAKE_DEVICE_BYTES)
    return _machine


def reset(devices: int | None = None, device_bytes: int | None = None, seed: int | None = None) -> Machine:
    """A fresh machine for this process (tests): everything the old one held is gone. ``seed``
    picks its stream order (default: ``GPUSNAP_FAKE_SEED``, else a random one)."""
    global _machine
    if _machine is not None and _machine.pid == os.getpid():
        _machine.close()
    devices = knobs.FAKE_DEVICES if devices is None else devices
    _machine = Machine(devices, device_bytes or knobs.FAKE_DEVICE_BYTES, seed)
    return _machine


def seed() -> int | None:
    """The stream-order seed of this process's machine (None before one is made)."""
    return _machine.work.seed if _machine is not None else None
