"""A fake ``cuda.bindings.driver`` for machines without a GPU (see ``machine.py`` for how it
is strict). Same names, parameters and ``(CUresult, outputs...)`` tuples as the real module,
whose types and enums it lends (``tests/device/test_device_contract.py`` holds the two together).
Functions it does not model raise AttributeError rather than pretend.
"""

from __future__ import annotations

import ctypes
import inspect
import sys

from cuda.bindings import driver as _real

from gpusnap import rawmem
from gpusnap.device.backend import AllocKind
from gpusnap.device.fake import machine as _machine
from gpusnap.device.fake.api import driver_api as _api
from gpusnap.device.fake.api import forward
from gpusnap.device.fake.api import machine as _m
from gpusnap.device.fake.api import size as _n
from gpusnap.device.fake.copies import (  # noqa: F401  (part of this module's API)
    cuMemcpy,
    cuMemcpyAsync,
    cuMemcpyDtoD,
    cuMemcpyDtoDAsync,
    cuMemcpyDtoH,
    cuMemcpyDtoHAsync,
    cuMemcpyHtoD,
    cuMemcpyHtoDAsync,
    cuMemsetD8,
    cuMemsetD8Async,
    cuMemsetD32,
    cuMemsetD32Async,
)
from gpusnap.device.fake.kernels import cuLaunchKernel, cuModuleGetFunction, cuModuleLoadData, cuModuleUnload  # noqa: F401
from gpusnap.device.fake.machine import STREAM_NON_BLOCKING, VMM_GRANULARITY, CudaFault

CUresult = _real.CUresult
__getattr__ = forward(_real, "cuda.bindings.driver")

DRIVER_VERSION = 13000  # what cuDriverGetVersion reports: CUDA 13.0


_uuids = {}  # ordinal -> ctypes buffer the CUuuid points into (kept alive here)

_ATTRIBUTES = {
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": lambda d: d.capability[0],
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": lambda d: d.capability[1],
    "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": lambda d: 132,
    "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING": lambda d: 1,
    "CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY": lambda d: 1,
    "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS": lambda d: 1,
    "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": lambda d: 1,
    "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED": lambda d: 1,
    "CU_DEVICE_ATTRIBUTE_PCI_BUS_ID": lambda d: d.ordinal + 1,
    "CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT": lambda d: 512,
}

# ---- initialisation, devices


@_api()
def cuInit(Flags):
    if _n(Flags) != 0:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    if not _machine.init().devices:
        raise CudaFault("CUDA_ERROR_NO_DEVICE")


@_api(1)
def cuDriverGetVersion():
    return DRIVER_VERSION


@_api(1)
def cuDeviceGetCount():
    return len(_m().devices)


@_api(1)
def cuDeviceGet(ordinal):
    return _real.CUdevice(_m().device(ordinal).ordinal)


@_api(1)
def cuDeviceGetName(length, dev):
    return _m().device(dev).name.encode()[: max(0, _n(length) - 1)]


@_api(1)
def cuDeviceTotalMem(dev):
    return _m().device(dev).total_bytes


@_api(1)
def cuDeviceGetAttribute(attrib, dev):
    device = _m().device(dev)
    get = _ATTRIBUTES.get(getattr(attrib, "name", ""))
    if get is None:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    return get(device)


@_api(1)
def cuDeviceGetUuid(dev):
    ordinal = _m().device(dev).ordinal
    if ordinal not in _uuids:
        _uuids[ordinal] = ctypes.create_string_buffer(b"gpusnap-fake-" + bytes([ordinal, 0, 0]), 16)
    return _real.CUuuid(ctypes.addressof(_uuids[ordinal]))


# ---- contexts


@_api(1)
def cuDevicePrimaryCtxRetain(dev):
    device = _m().device(dev)
    device.primary_refs += 1
    return _real.CUcontext(device.primary.handle)


@_api()
def cuDevicePrimaryCtxRelease(dev):
    device = _m().device(dev)
    if device.primary_refs == 0:
        raise CudaFault("CUDA_ERROR_INVALID_CONTEXT")
    device.primary_refs -= 1


@_api(2)
def cuDevicePrimaryCtxGetState(dev):
    device = _m().device(dev)
    return 0, int(device.primary_refs > 0)


@_api(1)
def cuCtxCreate(ctxCreateParams, flags, dev):
    m = _m()
    ctx = m.create_context(dev)
    m.stack().append(ctx)
    return _real.CUcontext(ctx.handle)


@_api()
def cuCtxDestroy(ctx):
    m = _m()
    context = m.context(ctx)
    if context.primary:
        raise CudaFault("CUDA_ERROR_INVALID_CONTEXT")
    m.sync_context(context)
    for alloc in [a for a in m.allocs.values() if a.ctx == context.handle]:
        m.free(alloc.base)  # a context's memory goes with it
    del m.contexts[context.handle]
    stack = m.stack()
    while context in stack:
        stack.remove(context)


@_api(1)
def cuCtxGetCurrent():
    stack = _m().stack()
    return _real.CUcontext(stack[-1].handle if stack else 0)


@_api()
def cuCtxSetCurrent(ctx):
    m = _m()
    stack = m.stack()
    if int(ctx) == 0:
        if stack:
            stack.pop()
        return
    context = m.context(ctx)
    if stack:
        stack[-1] = context
    else:
        stack.append(context)


@_api()
def cuCtxPushCurrent(ctx):
    m = _m()
    m.stack().append(m.context(ctx))


@_api(1)
def cuCtxPopCurrent():
    stack = _m().stack()
    if not stack:
        raise CudaFault("CUDA_ERROR_INVALID_CONTEXT")
    return _real.CUcontext(stack.pop().handle)


@_api(1)
def cuCtxGetDevice():
    return _real.CUdevice(_m().current().device)


@_api()
def cuCtxSynchronize():
    m = _m()
    m.sync_context(m.current())


# ---- streams


@_api(1)
def cuStreamCreate(Flags):
    stream = _m().new_stream(blocking=not _n(Flags) & STREAM_NON_BLOCKING)
    return _real.CUstream(stream.handle)


@_api()
def cuStreamDestroy(hStream):
    _m().destroy_stream(hStream)


@_api()
def cuStreamSynchronize(hStream):
    m = _m()
    m.sync_stream(m.stream(hStream))


@_api()
def cuStreamQuery(hStream):
    # SUCCESS means "as if synchronized"; pending work runs now but the first query still
    # says NOT_READY, so a single poll is never mistaken for a synchronize.
    m = _m()
    stream = m.stream(hStream)
    if stream.pending:
        m.sync_stream(stream)
        raise CudaFault("CUDA_ERROR_NOT_READY")


def _event(hEvent) -> _machine.Event:
    event = _m().events.get(int(hEvent))
    if event is None:
        raise CudaFault("CUDA_ERROR_INVALID_HANDLE")
    return event


@_api(1)
def cuEventCreate(Flags):
    m = _m()
    m.current()
    event = _machine.Event(m.new_handle())
    m.events[event.handle] = event
    return _real.CUevent(event.handle)


@_api()
def cuEventDestroy(hEvent):
    del _m().events[_event(hEvent).handle]


@_api()
def cuEventRecord(hEvent, hStream):
    m = _m()
    m.record(_event(hEvent), m.stream(hStream))


@_api()
def cuEventSynchronize(hEvent):
    _m().wait_event(_event(hEvent))


@_api()
def cuEventQuery(hEvent):
    # As cuStreamQuery: pending work runs now, but the first query still says NOT_READY.
    event = _event(hEvent)
    if not event.done:
        _m().wait_event(event)
        raise CudaFault("CUDA_ERROR_NOT_READY")


@_api()
def cuStreamWaitEvent(hStream, hEvent, Flags):
    m = _m()
    # The stream's later work follows the work the event marks, and nothing else of its stream.
    m.enqueue(m.stream(hStream), lambda: None, after=m.event_op(_event(hEvent)))


# ---- memory


@_api(1)
def cuMemAlloc(bytesize):
    m = _m()
    ctx = m.current()
    return _real.CUdeviceptr(m.alloc_device(_n(bytesize), ctx.device, ctx).base)


@_api(2)
def cuMemAllocPitch(WidthInBytes, Height, ElementSizeBytes):
    if _n(ElementSizeBytes) not in (4, 8, 16) or _n(WidthInBytes) <= 0 or _n(Height) <= 0:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    m = _m()
    pitch = -(-_n(WidthInBytes) // 512) * 512
    ctx = m.current()
    return _real.CUdeviceptr(m.alloc_device(pitch * _n(Height), ctx.device, ctx).base), pitch


@_api(1)
def cuMemAllocManaged(bytesize, flags):
    m = _m()
    return _real.CUdeviceptr(m.alloc_managed(_n(bytesize), m.current().device).base)


@_api(1)
def cuMemAllocAsync(bytesize, hStream):
    m = _m()
    stream = m.stream(hStream)
    # The address is valid at once; its memory belongs to the stream's order, like the pool's.
    return _real.CUdeviceptr(m.alloc_device(_n(bytesize), stream.ctx.device, stream.ctx).base)


@_api()
def cuMemFree(dptr):
    m = _m()
    # Freeing waits for the context's work (cudaFree synchronizes the device).
    m.sync_context(m.current())
    m.free(int(dptr))


@_api()
def cuMemFreeAsync(dptr, hStream):
    m = _m()
    address = int(dptr)
    alloc = m.find(address)
    if alloc is None or alloc.base != address or alloc.kind is not AllocKind.DEVICE:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    m.enqueue(m.stream(hStream), lambda: m.free(address))


@_api(2)
def cuMemGetInfo():
    m = _m()
    device = m.devices[m.current().device]
    return device.total_bytes - device.used_bytes, device.total_bytes


@_api(2)
def cuMemGetAddressRange(dptr):
    m = _m()
    m.current()  # the driver answers in a context only
    alloc = m.find(int(dptr))
    if alloc is None:
        raise CudaFault("CUDA_ERROR_NOT_FOUND")
    return _real.CUdeviceptr(alloc.base), _rounded(alloc)


def _rounded(alloc) -> int:
    """The size the driver reports for an allocation: rounded up to its granularity, not the
    size the program asked for (which only the program, and gpusnap's registry, know)."""
    return -(-alloc.nbytes // _machine.ALIGN) * _machine.ALIGN


@_api(1)
def cuPointerGetAttribute(attribute, ptr):
    m = _m()
    alloc = m.find(int(ptr))
    if alloc is None:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    name = getattr(attribute, "name", "")
    if name == "CU_POINTER_ATTRIBUTE_IS_MANAGED":
        return alloc.kind is AllocKind.MANAGED
    if name == "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL":
        return alloc.device
    if name == "CU_POINTER_ATTRIBUTE_RANGE_START_ADDR":
        return _real.CUdeviceptr(alloc.base)
    if name == "CU_POINTER_ATTRIBUTE_RANGE_SIZE":
        return _rounded(alloc)
    if name == "CU_POINTER_ATTRIBUTE_MEMORY_TYPE":
        return _real.CUmemorytype.CU_MEMORYTYPE_DEVICE
    raise CudaFault("CUDA_ERROR_NOT_SUPPORTED")


# ---- host registration, page-locked host memory


@_api()
def cuMemHostRegister(p, bytesize, Flags):
    _m().register(rawmem.address_of(p), _n(bytesize))


@_api()
def cuMemHostUnregister(p):
    _m().unregister(rawmem.address_of(p))


@_api(1)
def cuMemAllocHost(bytesize):
    m = _m()
    m.current()  # it needs a context
    return m.alloc_pinned(_n(bytesize))


@_api()
def cuMemFreeHost(p):
    _m().free_pinned(rawmem.address_of(p))


# ---- virtual memory management


@_api(1)
def cuMemGetAllocationGranularity(prop, option):
    _m().device(prop.location.id)
    return VMM_GRANULARITY


@_api(1)
def cuMemAddressReserve(size, alignment, addr, flags):
    if _n(alignment) not in (0, VMM_GRANULARITY) and _n(alignment) % VMM_GRANULARITY:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    return _real.CUdeviceptr(_m().reserve(_n(size), int(addr)))


@_api()
def cuMemAddressFree(ptr, size):
    _m().unreserve(int(ptr), _n(size))


@_api(1)
def cuMemCreate(size, prop, flags):
    if prop is None or prop.type != _real.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    if prop.location.type != _real.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaFault("CUDA_ERROR_NOT_SUPPORTED")
    return _real.CUmemGenericAllocationHandle(_m().create_physical(_n(size), prop.location.id).handle)


@_api()
def cuMemRelease(handle):
    _m().release_physical(int(handle))


@_api()
def cuMemMap(ptr, size, offset, handle, flags):
    _m().map(int(ptr), _n(size), _n(offset), int(handle))


@_api()
def cuMemUnmap(ptr, size):
    m = _m()
    for ctx in list(m.contexts.values()):  # unmapping waits for work that may use the range
        if not ctx.error:
            m.sync_context(ctx)
    m.unmap(int(ptr), _n(size))


@_api()
def cuMemSetAccess(ptr, size, desc, count):
    descs = list(desc or [])[: _n(count)]
    if not descs:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    readwrite = _real.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    if all(d.flags != readwrite for d in descs):
        raise CudaFault("CUDA_ERROR_NOT_SUPPORTED")  # read-only or no access: not modelled
    _m().set_access(int(ptr), _n(size))


@_api(1)
def cuMemRetainAllocationHandle(addr):
    m = _m()
    alloc = m.find(rawmem.address_of(addr))
    if alloc is None or alloc.kind is not AllocKind.VMM:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    # Retaining keeps the physical memory until the matching cuMemRelease, as in the driver.
    phys = m.physical[alloc.handle]
    phys.refs += 1
    return _real.CUmemGenericAllocationHandle(phys.handle)


# ---- errors


@_api(1)
def cuGetErrorName(error):
    return error.name.encode()


@_api(1)
def cuGetErrorString(error):
    return error.name.replace("CUDA_ERROR_", "").replace("_", " ").lower().encode()


__all__ = [name for name, value in vars(sys.modules[__name__]).items() if name.startswith("cu") and inspect.isfunction(value)]
