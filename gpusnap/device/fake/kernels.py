"""Modules and launches of the fake driver (part of ``driver``, which re-exports the functions
here). The fake cannot run machine code, so it loads only gpusnap's own kernels, from
``FINGERPRINT_IMAGE``, and runs each launch as a NumPy emulation that follows the kernel's
work split: block ``b`` of the accumulate kernel adds the words of tiles ``b % per_chunk``,
``b % per_chunk + per_chunk``, ... of chunk ``b // per_chunk`` of the chunk table (its
address and length in device memory, as the launch gives it), as ``fingerprint.cu`` does. A
launch with too few blocks, arguments out of order or an accumulator left dirty gives wrong
fingerprints here as it would on a GPU; the kernel's own arithmetic is checked on a GPU only.
"""

from __future__ import annotations

import numpy as np
from cuda.bindings import driver as _real

from gpusnap.device import fingerprint as fp
from gpusnap import rawmem
from gpusnap.device import kernels as real_kernels
from gpusnap.device.fake.api import driver_api as _api
from gpusnap.device.fake.api import machine as _m
from gpusnap.device.fake.machine import CudaFault

FINGERPRINT_IMAGE = b"gpusnap fake image: " + real_kernels.FINGERPRINT_SOURCE.encode()
_U64 = np.uint64


def _u64s(m, ctx, address: int, count: int) -> np.ndarray:
    host = m.kernel_address(address, count * 8, ctx)
    return np.frombuffer(rawmem.view_at(host, count * 8), dtype="<u8")


def _accumulate(m, ctx, grid: int, block: int, args) -> None:
    table, chunks, per_chunk, acc = args
    entries = _u64s(m, ctx, table, 2 * chunks)
    sums = _u64s(m, ctx, acc, 2 * chunks)
    tile_words = block * real_kernels.FINGERPRINT_WORDS_PER_THREAD
    # Block b works on chunk b // per_chunk, tiles b % per_chunk + k * per_chunk: so a chunk gets
    # the tiles whose (index % per_chunk) is one of the block numbers launched for it.
    for chunk in range(min(chunks, -(-grid // per_chunk))):
        launched = min(per_chunk, grid - chunk * per_chunk)
        address, n = int(entries[2 * chunk]), int(entries[2 * chunk + 1])
        data = np.frombuffer(rawmem.view_at(m.kernel_address(address, n, ctx), n), np.uint8)
        for lane, terms in enumerate(fp.word_terms(data)):
            tiles = _tile_sums(terms, tile_words)
            covered = np.arange(len(tiles)) % per_chunk < launched
            with np.errstate(over="ignore"):
                sums[2 * chunk + lane] += tiles[covered].sum(dtype=_U64)


def _tile_sums(terms: np.ndarray, tile_words: int) -> np.ndarray:
    padded = np.zeros(-(-len(terms) // tile_words) * tile_words, dtype=_U64)
    padded[: len(terms)] = terms
    return padded.reshape(-1, tile_words).sum(axis=1, dtype=_U64)


def _finalize(m, ctx, grid: int, block: int, args) -> None:
    table, chunks, acc = args
    entries = _u64s(m, ctx, table, 2 * chunks)
    sums = _u64s(m, ctx, acc, 2 * chunks)
    for c in range(min(chunks, grid * block)):
        n = int(entries[2 * c + 1])
        sums[2 * c : 2 * c + 2] = np.frombuffer(fp.finalize(int(sums[2 * c]), int(sums[2 * c + 1]), n), dtype="<u8")


_EMULATIONS = {
    real_kernels.FINGERPRINT_ACCUMULATE.encode(): _accumulate,
    real_kernels.FINGERPRINT_FINALIZE.encode(): _finalize,
}
_modules: dict[int, bytes] = {}  # handle -> image
_functions: dict[int, object] = {}  # handle -> emulation


@_api(1)
def cuModuleLoadData(image):
    m = _m()
    m.current()
    if bytes(image) != FINGERPRINT_IMAGE:
        raise CudaFault("CUDA_ERROR_INVALID_IMAGE")  # no machine code runs on the fake
    handle = m.new_handle()
    _modules[handle] = bytes(image)
    return _real.CUmodule(handle)


@_api()
def cuModuleUnload(hmod):
    _m()
    if _modules.pop(int(hmod), None) is None:
        raise CudaFault("CUDA_ERROR_INVALID_HANDLE")


@_api(1)
def cuModuleGetFunction(hmod, name):
    m = _m()
    if int(hmod) not in _modules:
        raise CudaFault("CUDA_ERROR_INVALID_HANDLE")
    emulation = _EMULATIONS.get(bytes(name))
    if emulation is None:
        raise CudaFault("CUDA_ERROR_NOT_FOUND")
    handle = m.new_handle()
    _functions[handle] = emulation
    return _real.CUfunction(handle)


@_api()
def cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra):
    m = _m()
    emulation = _functions.get(int(f))
    if emulation is None:
        raise CudaFault("CUDA_ERROR_INVALID_HANDLE")
    # Only the (values, ctypes types) form of kernelParams: gpusnap's own launches use it.
    if not (isinstance(kernelParams, tuple) and len(kernelParams) == 2 and len(kernelParams[0]) == len(kernelParams[1])):
        raise CudaFault("CUDA_ERROR_NOT_SUPPORTED")
    if (int(gridDimY), int(gridDimZ), int(blockDimY), int(blockDimZ)) != (1, 1, 1, 1) or int(blockDimX) % 32:
        raise CudaFault("CUDA_ERROR_INVALID_VALUE")  # the kernels reduce per warp, in x only
    args = [int(value) for value in kernelParams[0]]
    grid, block = int(gridDimX), int(blockDimX)
    stream = m.stream(hStream)
    m.enqueue(stream, lambda: emulation(m, stream.ctx, grid, block, args))
