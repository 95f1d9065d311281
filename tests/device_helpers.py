"""What the device tests share: a program's view of a GPU (real or fake), page-aligned host
buffers, and running a function in a forked child."""

from __future__ import annotations

import faulthandler
import json
import mmap
import os
import pathlib
import signal

import numpy as np

from gpusnap.device.calls import check

GOLDEN = pathlib.Path(__file__).parent / "golden" / "fingerprint.json"


class Program:
    """What a cuda-python program does before gpusnap looks: retain device 0's primary context
    and make it current, as torch or a raw cuda-python script would."""

    def __init__(self, cu, ordinal: int = 0):
        self.cu = cu
        self.dev = check("cuDeviceGet", cu.cuDeviceGet(ordinal))
        self.ctx = check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(self.dev))
        check("cuCtxPushCurrent", cu.cuCtxPushCurrent(self.ctx))

    def alloc(self, nbytes: int) -> int:
        return int(check("cuMemAlloc", self.cu.cuMemAlloc(nbytes)))

    def managed(self, nbytes: int) -> int:
        flags = int(self.cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
        return int(check("cuMemAllocManaged", self.cu.cuMemAllocManaged(nbytes, flags)))

    def put(self, ptr: int, data: np.ndarray) -> None:
        """Bytes to the device, there for every stream once this returns: a synchronous copy
        from pageable memory may still be in flight when it returns, ordered only with the
        legacy stream, and gpusnap's stream is a non-blocking one."""
        check("cuMemcpyHtoD", self.cu.cuMemcpyHtoD(ptr, data, data.nbytes))
        check("cuCtxSynchronize", self.cu.cuCtxSynchronize())

    def get(self, ptr: int, nbytes: int) -> np.ndarray:
        out = np.zeros(nbytes, np.uint8)
        check("cuMemcpyDtoH", self.cu.cuMemcpyDtoH(out, ptr, nbytes))
        return out

    def free(self, ptr: int) -> None:
        check("cuMemFree", self.cu.cuMemFree(ptr))

    def close(self) -> None:
        check("cuCtxPopCurrent", self.cu.cuCtxPopCurrent())
        check("cuDevicePrimaryCtxRelease", self.cu.cuDevicePrimaryCtxRelease(self.dev))


def host_buffer(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned host memory, as the staging arena is (keep the mmap alive)."""
    region = mmap.mmap(-1, nbytes)
    return region, np.frombuffer(region, dtype=np.uint8)


def in_child(work) -> dict:
    """Run ``work()`` in a forked child; returns {"ok": result} or {"signal": N} or {"error": ...}."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        faulthandler.disable()  # a fault is what some tests expect: no traceback dump on stderr
        try:
            result = {"ok": work()}
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(result, default=str).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return json.loads(data)


SIGSEGV = int(signal.SIGSEGV)


def pattern(kind: str, nbytes: int) -> np.ndarray:
    i = np.arange(nbytes, dtype=np.uint64)
    if kind == "zeros":
        return np.zeros(nbytes, dtype=np.uint8)
    if kind == "ones":
        return np.full(nbytes, 0xFF, dtype=np.uint8)
    if kind == "counter":
        return (i & np.uint64(0xFF)).astype(np.uint8)
    # A multiplicative hash of the index: every byte value, no short period.
    with np.errstate(over="ignore"):
        return ((i * np.uint64(2654435761)) >> np.uint64(11) & np.uint64(0xFF)).astype(np.uint8)


def golden() -> list[dict]:
    """The golden fingerprint cases (tests/golden/fingerprint.json)."""
    return json.loads(GOLDEN.read_text())["cases"]


