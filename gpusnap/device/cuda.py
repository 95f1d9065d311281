"""``CudaBackend``: the GPU backend over cuda-python's driver API.

It is written against ``cuda.bindings.driver`` and takes the module as a parameter, so that CI
runs this very code over the fake driver (``fake.FakeBackend``); only the fingerprint launch
(an NVRTC-compiled kernel) needs a real GPU.

Choices that follow from the design:
- It works in the program's own primary contexts and never creates one: a device the program
  has not touched is not "in use" and is never synchronized or staged.
- All its work goes on one non-blocking stream per device, so it neither waits for nor delays
  the program's legacy-stream work; ``synchronize`` is a context synchronize, which covers the
  program's streams too (the quiesce step) and gpusnap's own.
- It calls the functions it needs through the originals (a tracking wrapper must keep the
  function it wraps as ``ORIGINAL_ATTR``), so its own scratch allocations never enter the
  registry of the program's raw allocations.
- Only calls whose parameters are the same in cuda-bindings 12.x and 13.x (no cuCtxCreate,
  no cuMemPrefetchAsync), so one backend serves both.
"""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager

import numpy as np

from gpusnap.device import fingerprint as fp
from gpusnap import rawmem
from gpusnap.device import kernels
from gpusnap.device.backend import ORIGINAL_ATTR, AllocKind, DeviceInfo, GpuBackend, PointerInfo
from gpusnap.device.calls import check, hint_for, loading, status_name
from gpusnap.errors import CudaCallFailed, NoDevice


def load_driver():
    """The real ``cuda.bindings.driver``, initialised; ``NoDevice`` without a driver."""
    with loading("the CUDA driver"):
        from cuda.bindings import driver

        init(driver)  # without libcuda this raises instead of returning
    return driver


def init(driver) -> None:
    """cuInit; a driver without a usable device (NO_DEVICE, a version mismatch) is ``NoDevice``."""
    status = driver.cuInit(0)[0]
    if int(status) != 0:
        raise NoDevice(f"cuInit failed with {status_name(status)}", hint_for(status_name(status)))


class CudaBackend(GpuBackend):
    name = "cuda"

    def __init__(self, driver=None):
        if driver is None:
            driver = load_driver()
        else:
            init(driver)
        self.cu = driver
        self._pid = os.getpid()
        self._contexts: dict[int, object] = {}  # ordinal -> retained primary CUcontext
        self._streams: dict[int, object] = {}
        self._kernels: dict[int, tuple] = {}  # ordinal -> (module, accumulate, finalize)
        self._scratch: dict[int, tuple[int, int]] = {}  # ordinal -> (device pointer, nbytes)
        self._registered: dict[int, int] = {}  # host address -> the device it was registered on
        self._keep: dict[int, list] = {}  # ordinal -> host buffers its stream has yet to read or write

    # ---- plumbing

    def call(self, name: str, *args):
        """Call driver function ``name`` (its original, never a tracking wrapper) and unwrap."""
        if os.getpid() != self._pid:
            # What CUDA itself answers in a forked child; said before the call, with the cause.
            raise CudaCallFailed(
                f"{name} called in a forked child (pid {os.getpid()})",
                "CUDA cannot be used in a forked child; only the trainee process may call it",
                call=name,
                code="CUDA_ERROR_NOT_INITIALIZED",
            )
        fn = getattr(self.cu, name)
        return check(name, getattr(fn, ORIGINAL_ATTR, fn)(*args))

    def _context(self, ordinal: int):
        ctx = self._contexts.get(ordinal)
        if ctx is None:
            dev = self.call("cuDeviceGet", ordinal)
            _, active = self.call("cuDevicePrimaryCtxGetState", dev)
            if not active:
                raise CudaCallFailed(
                    f"device {ordinal} is not used by the program",
                    "gpusnap only works on devices the program has used; please report this",
                    call="cuDevicePrimaryCtxGetState",
                    code="inactive",
                )
            ctx = self._contexts[ordinal] = self.call("cuDevicePrimaryCtxRetain", dev)
        return ctx

    @contextmanager
    def on(self, ordinal: int):
        """Make device ``ordinal``'s primary context current for the calls inside."""
        self.call("cuCtxPushCurrent", self._context(ordinal))
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent")

    def stream(self, ordinal: int):
        """gpusnap's own stream on ``ordinal``; call inside ``on(ordinal)``."""
        stream = self._streams.get(ordinal)
        if stream is None:
            flags = self.cu.CUstream_flags.CU_STREAM_NON_BLOCKING
            stream = self._streams[ordinal] = self.call("cuStreamCreate", int(flags))
        return stream

    # ---- devices

    def device_count(self) -> int:
        return self.call("cuDeviceGetCount")

    def devices_in_use(self) -> list[int]:
        used = []
        for ordinal in range(self.device_count()):
            _, active = self.call("cuDevicePrimaryCtxGetState", self.call("cuDeviceGet", ordinal))
            if active:
                used.append(ordinal)
        return used

    def own_context(self) -> tuple[int, int] | None:
        """(handle, device) of the calling thread's current context where it is not its device's
        primary one (a context the program made itself), else None. Creates no context."""
        ctx = self.call("cuCtxGetCurrent")
        if not int(ctx):
            return None
        device = int(self.call("cuCtxGetDevice"))
        _, active = self.call("cuDevicePrimaryCtxGetState", self.call("cuDeviceGet", device))
        if active and int(self._context(device)) == int(ctx):
            return None
        return int(ctx), device

    def current_device(self) -> int:
        """The device of the calling thread's current context, else the first one in use."""
        if int(self.call("cuCtxGetCurrent")):
            return int(self.call("cuCtxGetDevice"))
        used = self.devices_in_use()
        if not used:
            raise CudaCallFailed("no device is in use", "gpusnap works on the devices the program uses; please report this",
                                 call="cuCtxGetCurrent", code="no context")
        return used[0]

    def device(self, ordinal: int) -> DeviceInfo:
        dev = self.call("cuDeviceGet", ordinal)
        attr = self.cu.CUdevice_attribute
        major = self.call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        minor = self.call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        name = self.call("cuDeviceGetName", 256, dev).split(b"\0", 1)[0].decode(errors="replace")
        uuid = self.call("cuDeviceGetUuid", dev).bytes.hex()
        return DeviceInfo(ordinal, name, (major, minor), self.call("cuDeviceTotalMem", dev), uuid)

    def pointer(self, address: int) -> PointerInfo:
        attr = self.cu.CUpointer_attribute
        # Attributes need no context; the address range does: the allocation's device's.
        managed = bool(self.call("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_IS_MANAGED, address))
        device = int(self.call("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address))
        if device < 0 and managed:  # managed memory that prefers the host names no device: any one in use reaches it
            device = self.current_device()
        with self.on(device):
            base, nbytes = self.call("cuMemGetAddressRange", address)
        kind = AllocKind.MANAGED if managed else AllocKind.DEVICE
        # Only VMM mappings have a physical allocation handle to retain.
        status, handle = self.cu.cuMemRetainAllocationHandle(address)
        if int(status) == 0:
            self.call("cuMemRelease", handle)
            kind = AllocKind.VMM
        return PointerInfo(kind, device, int(base), int(nbytes))

    # ---- host memory

    def register_host(self, address: int, nbytes: int) -> None:
        used = self.devices_in_use()
        if not used:
            raise CudaCallFailed(
                "no device is in use to register host memory with",
                "register the staging arena only once the program uses a GPU",
                call="cuMemHostRegister",
                code="no context",
            )
        with self.on(used[0]):
            # Portable: pinned for every context, so one registration serves every device.
            self.call("cuMemHostRegister", address, nbytes, self.cu.CU_MEMHOSTREGISTER_PORTABLE)
        self._registered[address] = used[0]

    def unregister_host(self, address: int) -> None:
        with self.on(self._registered[address]):
            self.call("cuMemHostUnregister", address)
        del self._registered[address]

    def managed_view(self, address: int, nbytes: int) -> memoryview:
        info = self.pointer(address)
        if info.kind is not AllocKind.MANAGED or address + nbytes > info.base + info.nbytes:
            raise CudaCallFailed(
                f"{address:#x}+{nbytes} is not inside one managed allocation",
                "only managed memory has a host view; copy device memory with copy_to_host",
                call="managed_view",
                code="not managed",
            )
        return rawmem.view_at(address, nbytes)

    # ---- copies, fingerprints, synchronize

    def copy_to_host(self, ordinal: int, src: int, dst_address: int, nbytes: int) -> None:
        with self.on(ordinal):
            self.call("cuMemcpyDtoHAsync", dst_address, src, nbytes, self.stream(ordinal))

    def copy_to_device(self, ordinal: int, dst: int, src_address: int, nbytes: int) -> None:
        with self.on(ordinal):
            self.call("cuMemcpyHtoDAsync", dst, src_address, nbytes, self.stream(ordinal))

    def synchronize(self, ordinal: int) -> None:
        with self.on(ordinal):
            self.call("cuCtxSynchronize")
        self._keep.pop(ordinal, None)  # host buffers enqueued work read or wrote: done now

    def scratch(self, ordinal: int, nbytes: int) -> int:
        """A device buffer of at least ``nbytes`` owned by gpusnap (grows, never shrinks)."""
        ptr, have = self._scratch.get(ordinal, (0, 0))
        if have < nbytes:
            if ptr:
                self.call("cuCtxSynchronize")  # the old buffer may still be in use
                # Forgotten before it is freed: after a failed allocation below (a full GPU)
                # the address may be the program's, and must never be freed again.
                del self._scratch[ordinal]
                self.call("cuMemFree", ptr)
            ptr = int(self.call("cuMemAlloc", nbytes))
            self._scratch[ordinal] = (ptr, nbytes)
        return ptr

    def kernel_image(self, ordinal: int) -> bytes:
        """gpusnap's kernels for ``ordinal``, compiled for its own architecture."""
        return kernels.compile_kernel(self.device(ordinal).arch).data

    def _fingerprint_kernels(self, ordinal: int) -> tuple:
        if ordinal not in self._kernels:
            module = self.call("cuModuleLoadData", self.kernel_image(ordinal))
            accumulate = self.call("cuModuleGetFunction", module, kernels.FINGERPRINT_ACCUMULATE.encode())
            finalize = self.call("cuModuleGetFunction", module, kernels.FINGERPRINT_FINALIZE.encode())
            self._kernels[ordinal] = (module, accumulate, finalize)
        return self._kernels[ordinal]

    def fingerprint(self, ordinal: int, src: int, nbytes: int, chunk_bytes: int, out) -> None:
        chunks = fp.chunk_count(nbytes, chunk_bytes)
        if chunks:
            self._fingerprint_table(ordinal, [(src, nbytes)], chunk_bytes, rawmem.address_of(out))

    def fingerprint_ranges(self, ordinal: int, ranges: list, chunk_bytes: int):
        table_chunks = sum(fp.chunk_count(nbytes, chunk_bytes) for _, nbytes in ranges)
        out = np.zeros((table_chunks, fp.FINGERPRINT_NBYTES), np.uint8)
        if table_chunks:
            self._fingerprint_table(ordinal, ranges, chunk_bytes, out.ctypes.data)
            self._keep.setdefault(ordinal, []).append(out)
        return out

    def _fingerprint_table(self, ordinal: int, ranges: list, chunk_bytes: int, out_address: int) -> None:
        """Enqueue the fingerprints of every chunk of ``ranges`` into the host buffer at
        ``out_address``: the chunk table goes to the device, then one accumulate and one
        finalize launch cover every chunk (``fingerprint.cu``)."""
        table = np.array([(src + start, length) for src, nbytes in ranges
                          for start, length in fp.chunk_spans(nbytes, chunk_bytes)], dtype="<u8")
        chunks = len(table)
        u64, ptr, uint = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint
        with self.on(ordinal):
            _, accumulate, finalize = self._fingerprint_kernels(ordinal)
            stream = self.stream(ordinal)
            acc = self.scratch(ordinal, 2 * chunks * fp.FINGERPRINT_NBYTES)
            on_device = acc + chunks * fp.FINGERPRINT_NBYTES  # the table, after the sums
            self._keep.setdefault(ordinal, []).append(table)  # read when the stream gets there
            self.call("cuMemcpyHtoDAsync", on_device, table.ctypes.data, table.nbytes, stream)
            self.call("cuMemsetD8Async", acc, 0, chunks * fp.FINGERPRINT_NBYTES, stream)
            threads = kernels.FINGERPRINT_THREADS
            tile_bytes = threads * kernels.FINGERPRINT_WORDS_PER_THREAD * 8
            # Blocks per chunk: enough for the whole launch to fill the GPU, never more than the
            # largest chunk has tiles; each block strides over its chunk, so any count covers it.
            wanted = -(-kernels.FINGERPRINT_TARGET_BLOCKS // chunks)
            per_chunk = max(1, min(-(-chunk_bytes // tile_bytes), wanted))
            args = ((on_device, chunks, per_chunk, acc), (ptr, u64, uint, ptr))
            self.call("cuLaunchKernel", accumulate, chunks * per_chunk, 1, 1, threads, 1, 1, 0, stream, args, 0)
            args = ((on_device, chunks, acc), (ptr, u64, ptr))
            self.call("cuLaunchKernel", finalize, -(-chunks // threads), 1, 1, threads, 1, 1, 0, stream, args, 0)
            self.call("cuMemcpyDtoHAsync", out_address, acc, chunks * fp.FINGERPRINT_NBYTES, stream)

    def fingerprint_agrees(self, ordinal: int) -> bool:
        """Fingerprint known bytes on ``ordinal`` (two ranges, one unaligned, chunks of every
        length the table can hold) and compare with the NumPy definition: a kernel that
        disagrees (a compiler, driver or architecture it was never run on) would pass changed
        chunks for clean ones, so staging asks this once per device before it trusts one."""
        chunk_bytes = 4096
        data = np.frombuffer(np.random.default_rng(20261125).bytes(5 * chunk_bytes + 13), np.uint8)
        first, second = data[: 3 * chunk_bytes + 5], data[3 * chunk_bytes + 5 :]
        with self.on(ordinal):
            ptr = int(self.call("cuMemAlloc", len(data) + 16))
            try:
                # The known bytes go on gpusnap's own stream, so the kernel reads them after they
                # landed: a synchronous copy from pageable memory may still be in flight when it
                # returns, ordered with the legacy stream only, and this stream is non-blocking.
                self.copy_to_device(ordinal, ptr, first.ctypes.data, len(first))
                self.copy_to_device(ordinal, ptr + len(first) + 11, second.ctypes.data, len(second))
                self._keep.setdefault(ordinal, []).append(data)
                out = self.fingerprint_ranges(ordinal, [(ptr, len(first)), (ptr + len(first) + 11, len(second))], chunk_bytes)
                self.synchronize(ordinal)
            finally:
                self.call("cuMemFree", ptr)
        expected = np.concatenate([fp.reference(first, chunk_bytes), fp.reference(second, chunk_bytes)])
        return bool((out == expected).all())

    def memory_used(self, ordinal: int) -> int:
        with self.on(ordinal):
            free, total = self.call("cuMemGetInfo")
        return int(total) - int(free) - self._scratch.get(ordinal, (0, 0))[1]

    def close(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked child owns none of it
        for ordinal in list(self._contexts):
            with self.on(ordinal):
                self.call("cuCtxSynchronize")
                if ordinal in self._scratch:
                    self.call("cuMemFree", self._scratch.pop(ordinal)[0])
                if ordinal in self._streams:
                    self.call("cuStreamDestroy", self._streams.pop(ordinal))
                if ordinal in self._kernels:
                    self.call("cuModuleUnload", self._kernels.pop(ordinal)[0])
        for address in list(self._registered):
            self.unregister_host(address)
        for ordinal, ctx in list(self._contexts.items()):
            self.call("cuDevicePrimaryCtxRelease", self.call("cuDeviceGet", ordinal))
            del self._contexts[ordinal]
