"""Copies and fills of the fake driver (part of ``driver``, which re-exports every function
here): stream-ordered, with the pageable/pinned rules that ``machine.py`` describes."""

from __future__ import annotations

import ctypes

import numpy as np

from gpusnap.device import hostmem
from gpusnap.device.fake.api import driver_api as _api
from gpusnap.device.fake.api import machine as _m
from gpusnap.device.fake.api import size as _n
from gpusnap.device.fake.machine import CudaFault


def _copy_op(m, dst: int, src: int, nbytes: int, source_bytes: bytes | None = None):
    """The copy as it runs on the device: both sides resolved *then*, so memory freed before
    the copy runs is an illegal address, as on a GPU."""

    def op():
        to = m.resolve(dst, nbytes, "CUDA_ERROR_ILLEGAL_ADDRESS") or dst
        if source_bytes is not None:
            ctypes.memmove(to, source_bytes, nbytes)
        else:
            ctypes.memmove(to, m.resolve(src, nbytes, "CUDA_ERROR_ILLEGAL_ADDRESS") or src, nbytes)

    return op


def _copy(dst, src, ByteCount, hStream=None, *, need_device_src=False, need_device_dst=False):
    m = _m()
    nbytes = _n(ByteCount)
    dst_addr = hostmem.address_of(dst)
    src_addr = hostmem.address_of(src)
    dst_dev = m.resolve(dst_addr, nbytes) is not None
    src_dev = m.resolve(src_addr, nbytes) is not None
    if (need_device_src and not src_dev) or (need_device_dst and not dst_dev):
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    if nbytes == 0:
        return
    if hStream is None:  # synchronous: on the legacy stream, after everything it waits for
        ctx = m.current()
        m.enqueue(ctx.legacy, _copy_op(m, dst_addr, src_addr, nbytes))
        m.sync_legacy(ctx)
        return
    stream = m.stream(hStream)
    if src_dev and not dst_dev and not m.pinned(dst_addr, nbytes):
        # Into pageable memory the call returns only once the copy is done.
        m.enqueue(stream, _copy_op(m, dst_addr, src_addr, nbytes))
        m.sync_stream(stream)
    elif dst_dev and not src_dev and not m.pinned(src_addr, nbytes):
        # From pageable memory the bytes are taken at the call, through a staging buffer.
        m.enqueue(stream, _copy_op(m, dst_addr, src_addr, nbytes, bytes(hostmem.view_at(src_addr, nbytes))))
    else:
        m.enqueue(stream, _copy_op(m, dst_addr, src_addr, nbytes))


@_api()
def cuMemcpy(dst, src, ByteCount):
    _copy(dst, src, ByteCount)


@_api()
def cuMemcpyAsync(dst, src, ByteCount, hStream):
    _copy(dst, src, ByteCount, hStream)


@_api()
def cuMemcpyDtoH(dstHost, srcDevice, ByteCount):
    _copy(dstHost, srcDevice, ByteCount, need_device_src=True)


@_api()
def cuMemcpyDtoHAsync(dstHost, srcDevice, ByteCount, hStream):
    _copy(dstHost, srcDevice, ByteCount, hStream, need_device_src=True)


@_api()
def cuMemcpyHtoD(dstDevice, srcHost, ByteCount):
    _copy(dstDevice, srcHost, ByteCount, need_device_dst=True)


@_api()
def cuMemcpyHtoDAsync(dstDevice, srcHost, ByteCount, hStream):
    _copy(dstDevice, srcHost, ByteCount, hStream, need_device_dst=True)


@_api()
def cuMemcpyDtoD(dstDevice, srcDevice, ByteCount):
    _copy(dstDevice, srcDevice, ByteCount, need_device_src=True, need_device_dst=True)


@_api()
def cuMemcpyDtoDAsync(dstDevice, srcDevice, ByteCount, hStream):
    _copy(dstDevice, srcDevice, ByteCount, hStream, need_device_src=True, need_device_dst=True)


def _memset(dstDevice, value: int, count: int, width: int, hStream):
    m = _m()
    address = int(dstDevice)
    if address % width:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    m.device_address(address, count * width)
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]

    def op():
        host = m.device_address(address, count * width, "CUDA_ERROR_ILLEGAL_ADDRESS")
        np.frombuffer(hostmem.view_at(host, count * width), dtype=dtype)[:] = value

    if hStream is None:
        ctx = m.current()
        m.enqueue(ctx.legacy, op)
        m.sync_legacy(ctx)
    else:
        m.enqueue(m.stream(hStream), op)


@_api()
def cuMemsetD8(dstDevice, uc, N):
    _memset(dstDevice, int(uc) & 0xFF, _n(N), 1, None)


@_api()
def cuMemsetD8Async(dstDevice, uc, N, hStream):
    _memset(dstDevice, int(uc) & 0xFF, _n(N), 1, hStream)


@_api()
def cuMemsetD32(dstDevice, ui, N):
    _memset(dstDevice, int(ui) & 0xFFFFFFFF, _n(N), 4, None)


@_api()
def cuMemsetD32Async(dstDevice, ui, N, hStream):
    _memset(dstDevice, int(ui) & 0xFFFFFFFF, _n(N), 4, hStream)
