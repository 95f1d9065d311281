"""A fake ``cuda.bindings.runtime`` over the fake driver, as the real runtime sits over the real
driver: each thread has a current device (0 until ``cudaSetDevice``) whose primary context the
runtime retains and makes current on first use. Returns ``(cudaError_t, outputs...)``."""

from __future__ import annotations

import inspect
import sys

from cuda.bindings import runtime as _real

from gpusnap.device.backend import ORIGINAL_ATTR
from gpusnap.device.fake import driver as _drv
from gpusnap.device.fake import machine as _machine
from gpusnap.device.fake.api import forward, returning
from gpusnap.device.fake.machine import CudaFault

cudaError_t = _real.cudaError_t
cudaStream_t = _real.cudaStream_t
__getattr__ = forward(_real, "cuda.bindings.runtime")

RUNTIME_VERSION = 13000

# Driver status -> the runtime's name for it.
TO_RUNTIME = {
    "CUDA_ERROR_INVALID_VALUE": "cudaErrorInvalidValue",
    "CUDA_ERROR_OUT_OF_MEMORY": "cudaErrorMemoryAllocation",
    "CUDA_ERROR_NOT_INITIALIZED": "cudaErrorInitializationError",
    "CUDA_ERROR_INVALID_DEVICE": "cudaErrorInvalidDevice",
    "CUDA_ERROR_INVALID_CONTEXT": "cudaErrorDeviceUninitialized",
    "CUDA_ERROR_INVALID_HANDLE": "cudaErrorInvalidResourceHandle",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "cudaErrorIllegalAddress",
    "CUDA_ERROR_NOT_READY": "cudaErrorNotReady",
    "CUDA_ERROR_NOT_SUPPORTED": "cudaErrorNotSupported",
    "CUDA_ERROR_NOT_FOUND": "cudaErrorSymbolNotFound",
    "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED": "cudaErrorHostMemoryAlreadyRegistered",
    "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED": "cudaErrorHostMemoryNotRegistered",
    "CUDA_ERROR_ALREADY_MAPPED": "cudaErrorInvalidValue",
}


def _status(name: str):
    return getattr(cudaError_t, TO_RUNTIME.get(name, name if name.startswith("cuda") else "cudaErrorUnknown"))


def _api(outputs: int = 0):
    return returning(cudaError_t.cudaSuccess, _status, outputs)


def _ctx():
    """Make the thread's device's primary context current, as the runtime does implicitly."""
    m = _machine.init()
    stack = m.stack()
    if not stack:
        ordinal = getattr(m.tls, "device", 0)
        stack.append(m.device(ordinal).primary)
        _retain(m, ordinal)
    return m.current()


def _retain(m, ordinal: int) -> None:
    if ordinal not in m.runtime_devices:  # the runtime holds one reference per device
        _call("cuDevicePrimaryCtxRetain", ordinal)
        m.runtime_devices.add(ordinal)


def _call(name: str, *args):
    """Call fake driver function ``name`` as the runtime calls the driver: underneath any
    tracking wrapper (the real runtime never goes through the Python driver module)."""
    fn = getattr(_drv, name)
    return _unwrap(getattr(fn, ORIGINAL_ATTR, fn)(*args))


def _unwrap(result):
    if int(result[0]) != 0:
        raise CudaFault(result[0].name)
    return result[1] if len(result) == 2 else result[1:] or None


@_api(1)
def cudaGetDeviceCount():
    return len(_machine.init().devices)


@_api()
def cudaSetDevice(device):
    m = _machine.init()
    ordinal = m.device(device).ordinal
    m.tls.device = ordinal  # per thread, as the runtime's current device is
    _retain(m, ordinal)
    stack = m.stack()
    if stack:
        stack[-1] = m.devices[ordinal].primary
    else:
        stack.append(m.devices[ordinal].primary)


@_api(1)
def cudaGetDevice():
    return getattr(_machine.init().tls, "device", 0)


@_api(1)
def cudaMalloc(size):
    _ctx()
    return int(_call("cuMemAlloc", size))


@_api(2)
def cudaMallocPitch(width, height):
    _ctx()
    ptr, pitch = _call("cuMemAllocPitch", width, height, 4)
    return int(ptr), pitch


@_api(1)
def cudaMallocManaged(size, flags):
    _ctx()
    return int(_call("cuMemAllocManaged", size, flags))


@_api(1)
def cudaMallocAsync(size, hStream):
    _ctx()
    return int(_call("cuMemAllocAsync", size, hStream))


@_api()
def cudaFree(devPtr):
    _ctx()
    if int(devPtr) != 0:  # cudaFree(0) is the classic way to initialise the runtime
        _call("cuMemFree", devPtr)


@_api()
def cudaFreeAsync(devPtr, hStream):
    _ctx()
    _call("cuMemFreeAsync", devPtr, hStream)


@_api()
def cudaMemcpy(dst, src, count, kind):
    _ctx()
    _call("cuMemcpy", dst, src, count)


@_api()
def cudaMemcpyAsync(dst, src, count, kind, stream):
    _ctx()
    _call("cuMemcpyAsync", dst, src, count, stream)


@_api()
def cudaMemset(devPtr, value, count):
    _ctx()
    _call("cuMemsetD8", devPtr, value, count)


@_api()
def cudaMemsetAsync(devPtr, value, count, stream):
    _ctx()
    _call("cuMemsetD8Async", devPtr, value, count, stream)


@_api()
def cudaDeviceSynchronize():
    _ctx()
    _call("cuCtxSynchronize")


@_api(1)
def cudaStreamCreate():
    _ctx()
    return cudaStream_t(int(_call("cuStreamCreate", 0)))


@_api(1)
def cudaStreamCreateWithFlags(flags):
    _ctx()
    return cudaStream_t(int(_call("cuStreamCreate", flags)))


@_api()
def cudaStreamDestroy(stream):
    _ctx()
    _call("cuStreamDestroy", stream)


@_api()
def cudaStreamSynchronize(stream):
    _ctx()
    _call("cuStreamSynchronize", stream)


@_api(1)
def cudaDriverGetVersion():
    return _drv.DRIVER_VERSION


@_api(1)
def cudaRuntimeGetVersion():
    return RUNTIME_VERSION


@_api(1)
def cudaGetErrorName(error):
    return error.name.encode()


@_api(1)
def cudaGetErrorString(error):
    return error.name.replace("cudaError", "").encode()


__all__ = [name for name, value in vars(sys.modules[__name__]).items() if name.startswith("cuda") and inspect.isfunction(value)]
