"""Copies and fills of the fake driver (part of ``driver``, which re-exports every function
here): stream-ordered (``streams.py``), with the pageable/pinned rules that ``machine.py``
describes, host memory reached through its registration's pages (``pinning.py``)."""

from __future__ import annotations

import ctypes

import numpy as np

from gpusnap import rawmem
from gpusnap.device.fake.api import driver_api as _api
from gpusnap.device.fake.api import machine as _m
from gpusnap.device.fake.api import size as _n
from gpusnap.device.fake.machine import CudaFault


def _copy_op(m, dst: int, src: int, nbytes: int, taken: np.ndarray | None = None):
    """The copy as it runs on the device: both sides resolved *then*, so memory freed before
    the copy runs is an illegal address, as on a GPU; host memory through its registration's
    pages (``pinning.py``), ``taken`` for a pageable source read at the call."""

    def op():
        to = m.resolve(dst, nbytes, "CUDA_ERROR_ILLEGAL_ADDRESS")
        source = m.resolve(src, nbytes, "CUDA_ERROR_ILLEGAL_ADDRESS") if taken is None else taken.ctypes.data
        if source is None:  # a host source, read now
            if to is None:
                ctypes.memmove(dst, src, nbytes)
            else:
                m.from_host(to, src, nbytes)
        elif to is None:
            m.to_host(dst, source, nbytes)
        else:
            ctypes.memmove(to, source, nbytes)

    return op


def _copy(dst, src, ByteCount, hStream=None, *, need_device_src=False, need_device_dst=False):
    """A copy as CUDA orders it (see ``streams.py`` for the order of the work itself): what the
    call waits for depends on the direction and on whether the host side is pinned."""
    m = _m()
    nbytes = _n(ByteCount)
    dst_addr = rawmem.address_of(dst)
    src_addr = rawmem.address_of(src)
    dst_dev = m.resolve(dst_addr, nbytes) is not None
    src_dev = m.resolve(src_addr, nbytes) is not None
    if (need_device_src and not src_dev) or (need_device_dst and not dst_dev):
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")
    if nbytes == 0:
        return
    from_pageable = dst_dev and not src_dev and not m.pinned(src_addr, nbytes)
    # From pageable memory the bytes are taken at the call, through a staging buffer.
    taken = np.frombuffer(bytes(rawmem.view_at(src_addr, nbytes)), np.uint8) if from_pageable else None
    if hStream is None:  # the synchronous API: on the legacy stream
        ctx = m.current()
        if from_pageable:
            # A stream sync first, then the call returns once the bytes are staged: the copy
            # itself may still be in flight, ordered only with later legacy-stream work.
            m.sync_legacy(ctx)
            m.enqueue(ctx.legacy, _copy_op(m, dst_addr, src_addr, nbytes, taken))
            return
        op = m.enqueue(ctx.legacy, _copy_op(m, dst_addr, src_addr, nbytes))
        if not (src_dev and dst_dev):  # device to device returns at once; to or from host memory when done
            m.complete(op)
        return
    op = m.enqueue(m.stream(hStream), _copy_op(m, dst_addr, src_addr, nbytes, taken))
    if src_dev and not dst_dev and not m.pinned(dst_addr, nbytes):
        m.complete(op)  # into pageable memory the call returns only once the copy is done


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
        np.frombuffer(rawmem.view_at(host, count * width), dtype=dtype)[:] = value

    # The synchronous memset of device memory returns before it runs, as CUDA's does.
    m.enqueue(m.current().legacy if hStream is None else m.stream(hStream), op)


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
