"""A fake ``cuda.core`` for machines without a GPU: the part of cuda.core 1.2.2 that training
programs use, on the fake machine (``machine.py``), with the real one's names, parameters and
behaviour (``tests/device/test_device_contract.py`` holds the two together):

- ``Device(ordinal)``, a thread-local singleton: ``set_current()`` makes its primary context
  current and retains it (the device then counts as used), and ``allocate``, ``create_stream``
  and ``sync`` refuse before it, as cuda.core's do;
- ``Buffer`` and ``ManagedBuffer``: ``copy_to``, ``copy_from`` and ``fill`` are enqueued on the
  stream they are given and run when it is synchronized (a pageable host source is read at the
  call, as the driver reads it); ``close`` frees through the memory resource, on a stream;
- ``DeviceMemoryResource``, ``ManagedMemoryResource`` (its buffers are host memory that a forked
  child faults on; ``ManagedMemoryResourceOptions`` for a pool that prefers the host), ``LegacyPinnedMemoryResource`` (page-locked host memory, do-not-fork);
- ``Stream`` (``sync``), ``LEGACY_DEFAULT_STREAM``, ``PER_THREAD_DEFAULT_STREAM``.

The real cuda.core calls the driver through Cython (``cydriver``), never through the Python
module ``cuda.bindings.driver``, so gpusnap's raw-allocation wrappers never see what it
allocates; this one allocates on the machine directly, for the same effect. A call the machine
refuses raises ``CUDAError`` (cuda.core's own is not public), a forked child's calls included.
What it does not model (contexts, IPC, copy options, graphs) raises ``NotImplementedError``.
"""

from __future__ import annotations

import contextlib
import operator
import sys
import threading

from gpusnap.device.backend import AllocKind
from gpusnap.device.fake import api, copies
from gpusnap.device.fake import driver as _driver
from gpusnap.device.fake import machine as _machine
from gpusnap.device.fake.machine import STREAM_LEGACY, STREAM_PER_THREAD, CudaFault

__all__ = [
    "Buffer",
    "Device",
    "DeviceMemoryResource",
    "LEGACY_DEFAULT_STREAM",
    "LegacyPinnedMemoryResource",
    "ManagedBuffer",
    "ManagedMemoryResource",
    "ManagedMemoryResourceOptions",
    "MemoryResource",
    "PER_THREAD_DEFAULT_STREAM",
    "Stream",
]


class CUDAError(Exception):
    """A driver call that failed (cuda.core raises ``cuda.core._utils.cuda_utils.CUDAError``)."""


@contextlib.contextmanager
def _calling():
    """One call on the machine: under the fake modules' lock, a refusal raised as cuda.core does."""
    try:
        with api._lock:
            yield
    except CudaFault as fault:
        raise CUDAError(fault.status) from None


# ---- devices and streams

_tls = threading.local()  # this thread's Device singletons, for the machine they belong to


class Device:
    """A GPU: ``Device(n)`` is the same object each time in one thread; ``Device()`` the
    current one (0 while none is current)."""

    __slots__ = ("_device_id", "_memory_resource", "_has_inited", "_retained")

    def __new__(cls, device_id: Device | int | None = None) -> Device:
        if isinstance(device_id, Device):
            return device_id
        with _calling():
            m = _machine.init()
            if device_id is None:
                stack = m.stack()
                device_id = stack[-1].device if stack else 0
            if getattr(_tls, "machine", None) is not m:  # a fresh machine (tests): fresh singletons
                _tls.machine, _tls.devices = m, [_new_device(cls, i) for i in range(len(m.devices))]
        device_id = operator.index(device_id)
        if device_id < 0:
            raise ValueError(f"device_id must be >= 0, got {device_id}")
        if device_id >= len(_tls.devices):
            raise ValueError(f"device_id must be within [0, {len(_tls.devices)}), got {device_id}")
        return _tls.devices[device_id]

    @classmethod
    def get_all_devices(cls) -> tuple[Device, ...]:
        with _calling():
            count = len(_machine.init().devices)
        return tuple(cls(ordinal) for ordinal in range(count))

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def memory_resource(self) -> MemoryResource:
        if self._memory_resource is None:
            self._memory_resource = DeviceMemoryResource(self._device_id)
        return self._memory_resource

    @memory_resource.setter
    def memory_resource(self, mr: MemoryResource) -> None:
        if not isinstance(mr, MemoryResource):
            raise TypeError(f"expected a MemoryResource, got {type(mr).__name__}")
        self._memory_resource = mr

    @property
    def default_stream(self) -> Stream:
        return LEGACY_DEFAULT_STREAM

    def set_current(self, ctx=None):
        if ctx is not None:
            raise NotImplementedError("the fake cuda.core models primary contexts only")
        with _calling():
            m = _machine.machine()
            device = m.device(self._device_id)
            if not self._retained:
                device.primary_refs += 1
                self._retained = True
            stack = m.stack()  # cuCtxSetCurrent: replaces the top of this thread's stack
            if stack:
                stack[-1] = device.primary
            else:
                stack.append(device.primary)
        self._has_inited = True

    def create_stream(self, obj=None, options=None) -> Stream:
        self._check_context_initialized()
        if obj is not None or options is not None:
            raise NotImplementedError("the fake cuda.core makes default non-blocking streams only")
        with _calling():
            m = _machine.machine()
            stream = m.new_stream(blocking=False, ctx=m.device(self._device_id).primary)
        return Stream._init(stream.handle, self._device_id)

    def allocate(self, size: int, *, stream: Stream) -> Buffer:
        self._check_context_initialized()
        return self.memory_resource.allocate(size, stream=stream)

    def sync(self) -> None:
        """cudaDeviceSynchronize: the work of the calling thread's current context."""
        self._check_context_initialized()
        with _calling():
            m = _machine.machine()
            m.sync_context(m.current())

    def _check_context_initialized(self) -> None:
        if not self._has_inited:
            raise CUDAError(f"Device {self._device_id} is not yet initialized, perhaps you forgot to call .set_current() first?")

    def __int__(self) -> int:
        return self._device_id

    def __reduce__(self):
        return Device, (self._device_id,)  # as cuda.core's: the singleton of that ordinal

    def __repr__(self) -> str:
        return f"<Device {self._device_id} (gpusnap fake device {self._device_id})>"


def _new_device(cls, ordinal: int) -> Device:
    device = object.__new__(cls)
    device._device_id, device._memory_resource, device._has_inited, device._retained = ordinal, None, False, False
    return device


class Stream:
    """A queue of work: made by ``Device.create_stream``, or one of the two default streams."""

    __slots__ = ("_handle", "_device_id", "_closed")

    def __init__(self, *args, **kwargs):
        raise RuntimeError("Stream objects cannot be instantiated directly. Please use Device APIs (create_stream).")

    @classmethod
    def _init(cls, handle: int, device_id: int | None) -> Stream:
        stream = object.__new__(cls)
        stream._handle, stream._device_id, stream._closed = handle, device_id, False
        return stream

    @property
    def handle(self):
        return _driver.CUstream(self._handle)

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def device(self) -> Device:
        """A default stream's is the current device's."""
        return Device(self._device_id)

    def sync(self) -> None:
        with _calling():
            m = _machine.machine()
            m.sync_stream(m.stream(self._handle))

    def __reduce__(self):
        raise TypeError("a Stream cannot be pickled")  # as cuda.core's: its handles are this process's

    def close(self) -> None:
        if self._closed or self._device_id is None:  # the default streams are never closed
            return
        with _calling():
            _machine.machine().destroy_stream(self._handle)
        self._closed = True


LEGACY_DEFAULT_STREAM = Stream._init(STREAM_LEGACY, None)
PER_THREAD_DEFAULT_STREAM = Stream._init(STREAM_PER_THREAD, None)


def _accept(stream) -> Stream:
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be a Stream, got {type(stream).__name__}")
    if stream.is_closed:
        raise RuntimeError("the stream is closed")
    return stream


# ---- memory resources


def _abstract(self):
    raise NotImplementedError


def _answer(value) -> property:
    """A memory resource's read-only property that always gives ``value``."""
    return property(lambda self: value)


class MemoryResource:
    """Where Buffers come from: ``allocate`` and ``deallocate``, and what kind of memory."""

    __slots__ = ()

    def allocate(self, size, *, stream) -> Buffer:
        raise NotImplementedError

    def deallocate(self, ptr, size, *, stream) -> None:
        raise NotImplementedError

    is_device_accessible = is_host_accessible = device_id = property(_abstract)
    is_managed = _answer(False)


class _MemPool(MemoryResource):
    """A stream-ordered pool: an allocation's address is valid at once; a deallocation runs when
    its stream gets there."""

    __slots__ = ()

    def __reduce__(self):
        raise TypeError("the fake cuda.core does not model IPC: a pool cannot be pickled")

    def deallocate(self, ptr, size, *, stream) -> None:
        stream = _accept(stream)
        address = int(ptr)
        with _calling():
            m = _machine.machine()
            m.enqueue(m.stream(stream._handle), lambda: m.free(address))


class DeviceMemoryResource(_MemPool):
    """The device's default pool."""

    __slots__ = ("_device_id",)

    def __init__(self, device_id: Device | int, options=None) -> None:
        if options is not None:
            raise NotImplementedError("the fake cuda.core models the default pool only")
        self._device_id = Device(device_id).device_id

    def allocate(self, size, *, stream) -> Buffer:
        stream = _accept(stream)
        with _calling():
            m = _machine.machine()
            m.stream(stream._handle)
            base = m.alloc_device(operator.index(size), self._device_id).base
        return Buffer._init(base, size, self, stream=stream)

    device_id = property(lambda self: self._device_id)
    is_device_accessible = _answer(True)
    is_host_accessible = _answer(False)


class ManagedMemoryResourceOptions:
    """Where a ``ManagedMemoryResource``'s pool prefers its memory to live: a device ordinal,
    -1 (or ``preferred_location_type="host"``) for the host, None for no preference."""

    __slots__ = ("preferred_location", "preferred_location_type")

    def __init__(self, preferred_location=None, preferred_location_type=None) -> None:
        self.preferred_location, self.preferred_location_type = preferred_location, preferred_location_type


class ManagedMemoryResource(_MemPool):
    """Managed memory, on the stream's device, with no preferred location (``device_id`` -1)
    unless its options name one; memory that prefers the host has no device ordinal in the
    driver's answer for it (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL -1)."""

    __slots__ = ("_prefers_host",)

    def __init__(self, options=None) -> None:
        where = (None, None) if options is None else (options.preferred_location, options.preferred_location_type)
        if where not in ((None, None), (-1, None), (None, "host")):
            raise NotImplementedError("the fake cuda.core models no preferred location, or the host")
        self._prefers_host = where != (None, None)

    def allocate(self, size, *, stream) -> ManagedBuffer:
        stream = _accept(stream)
        with _calling():
            m = _machine.machine()
            device = m.stream(stream._handle).ctx.device
            base = m.alloc_managed(operator.index(size), -1 if self._prefers_host else device).base
        return ManagedBuffer._init(base, size, self, stream=stream)

    device_id = _answer(-1)
    is_device_accessible = is_host_accessible = is_managed = _answer(True)


class LegacyPinnedMemoryResource(MemoryResource):
    """Page-locked host memory (cuMemAllocHost): synchronous, bound to no device."""

    __slots__ = ()

    def allocate(self, size: int, *, stream=None) -> Buffer:
        if stream is not None:
            _accept(stream)
        ptr = 0
        if size:
            with _calling():
                m = _machine.machine()
                m.current()  # cuMemAllocHost needs a context
                ptr = m.alloc_pinned(operator.index(size))
        return Buffer._init(ptr, size, self)

    def deallocate(self, ptr, size: int, *, stream=None) -> None:
        if stream is not None:
            _accept(stream).sync()
        if size:
            with _calling():
                _machine.machine().free_pinned(int(ptr))

    is_device_accessible = is_host_accessible = _answer(True)

    @property
    def device_id(self) -> int:
        raise RuntimeError("a pinned memory resource is not bound to any GPU")


# ---- buffers


class Buffer:
    """Memory at ``handle`` of ``size`` bytes, freed through its ``memory_resource`` when closed
    or collected."""

    __slots__ = ("_ptr", "_size", "_memory_resource", "_owner", "_stream", "_closed", "_machine")

    def __init__(self, *args, **kwargs):
        raise RuntimeError("Buffer objects cannot be instantiated directly. Please use MemoryResource APIs.")

    @classmethod
    def _init(cls, ptr, size, mr=None, owner=None, *, stream=None) -> Buffer:
        if mr is not None and owner is not None:
            raise ValueError("owner and memory resource cannot be both specified together")
        if stream is not None and mr is None:
            raise ValueError("stream requires a memory resource (mr)")
        buffer = object.__new__(cls)
        buffer._ptr, buffer._size, buffer._memory_resource, buffer._owner = int(ptr), operator.index(size), mr, owner
        # The stream that frees it: the allocation's, else the default one (device memory only).
        default = LEGACY_DEFAULT_STREAM if mr is not None and mr.is_device_accessible else None
        buffer._stream, buffer._closed = stream or default, False
        buffer._machine = _machine._machine  # a Buffer outliving its fake machine (tests) is closed
        return buffer

    @staticmethod
    def from_handle(ptr, size, mr=None, owner=None, *, stream=None) -> Buffer:
        return Buffer._init(ptr, size, mr, owner, stream=stream)

    def close(self, stream=None) -> None:
        if self._closed:
            return
        mr, ptr, size = self._memory_resource, self._ptr, self._size
        self._ptr = self._size = 0
        self._memory_resource = self._owner = None
        self._closed = True
        if mr is not None and self._machine is _machine._machine:
            mr.deallocate(ptr, size, stream=stream or self._stream)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - cuda.core only warns when a collected buffer cannot be freed
            pass

    def __reduce__(self):
        # The real one exports an IPC handle; a copy of the pointer would name another
        # process's memory. gpusnap's pickler reduces Buffers itself.
        raise TypeError("the fake cuda.core does not model IPC: a Buffer cannot be pickled")

    def copy_to(self, dst: Buffer | None = None, *, stream, options=None) -> Buffer:
        self._check_open()
        stream = _accept(stream)
        if dst is None:
            if self._memory_resource is None:
                raise ValueError("a destination buffer must be provided (this buffer does not have a memory_resource)")
            dst = self._memory_resource.allocate(self._size, stream=stream)
        _copy(dst, self, stream, options)
        return dst

    def copy_from(self, src: Buffer, *, stream, options=None) -> None:
        self._check_open()
        _copy(self, src, _accept(stream), options)

    def fill(self, value, *, stream) -> None:
        self._check_open()
        stream = _accept(stream)
        value, width = _fill_value(value)
        if self._size % width:
            raise ValueError(f"buffer size ({self._size}) must be divisible by {width}")
        with _calling():
            copies._memset(self._ptr, value, self._size // width, width, stream._handle)

    @property
    def handle(self) -> int:
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def owner(self):
        return self._owner

    @property
    def memory_resource(self) -> MemoryResource | None:
        return self._memory_resource

    @property
    def is_closed(self) -> bool:
        # A Buffer of a fake machine that tests have replaced since is gone with its memory.
        return self._closed or self._machine is not _machine._machine

    # The memory resource answers where there is one, else the driver for the pointer, as in cuda.core.
    device_id = property(lambda self: self._ask("device_id", 2))
    is_device_accessible = property(lambda self: self._ask("is_device_accessible", 1))
    is_host_accessible = property(lambda self: self._ask("is_host_accessible", 0))

    @property
    def is_managed(self) -> bool:
        self._check_open()
        return self._attributes()[3] or (self._memory_resource is not None and self._memory_resource.is_managed)

    def _ask(self, name: str, index: int):
        self._check_open()
        if self._memory_resource is not None:
            return getattr(self._memory_resource, name)
        return self._attributes()[index]

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Buffer has been closed")

    def _attributes(self) -> tuple[bool, bool, int, bool]:
        """(host-accessible, device-accessible, device, managed), as the driver answers for the
        pointer (cuPointerGetAttributes): in the process that owns the machine only."""
        with _calling():
            m = _machine.machine()
            alloc = m.find(self._ptr)
            if alloc is not None:
                managed = alloc.kind is AllocKind.MANAGED
                return managed, True, alloc.device, managed
            if m.in_device_space(self._ptr):
                raise CudaFault("CUDA_ERROR_INVALID_VALUE")  # freed device memory
            if m.pinned(self._ptr, 1):
                stack = m.stack()
                return True, True, stack[-1].device if stack else 0, False
        return True, False, -1, False

    def __eq__(self, other) -> bool:
        if not isinstance(other, Buffer):
            return NotImplemented
        return (self._ptr, self._size) == (other._ptr, other._size)

    def __hash__(self) -> int:
        return hash((self._ptr, self._size))

    def __repr__(self) -> str:
        return f"<Buffer ptr={self._ptr:#x} size={self._size}>"


class ManagedBuffer(Buffer):
    """A Buffer of managed memory (what ``ManagedMemoryResource.allocate`` returns)."""

    __slots__ = ()


def _copy(dst: Buffer, src: Buffer, stream: Stream, options) -> None:
    if options is not None:
        raise NotImplementedError("the fake cuda.core does not model CopyOptions")
    dst._check_open()
    src._check_open()
    if dst.size != src.size:
        raise ValueError(f"buffer sizes mismatch between src and dst (sizes are: src={src.size}, dst={dst.size})")
    with _calling():
        copies._copy(dst.handle, src.handle, dst.size, stream._handle)


def _fill_value(value) -> tuple[int, int]:
    """(value, width in bytes) of a fill pattern: an int byte, or 1, 2 or 4 bytes of a buffer."""
    if isinstance(value, int):
        if not 0 <= value < 256:
            raise OverflowError(f"value must be in range [0, 256), got {value}")
        return value, 1
    try:
        pattern = memoryview(value).cast("B")
    except TypeError:
        raise TypeError(f"value must be an int or support the buffer protocol, got {type(value).__name__}") from None
    if len(pattern) not in (1, 2, 4):
        raise ValueError(f"value must be 1, 2, or 4 bytes, got {len(pattern)}")
    return int.from_bytes(pattern, sys.byteorder), len(pattern)
