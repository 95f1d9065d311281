"""Raw host memory for the stage: views at addresses, page rounding, madvise, address ranges."""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os

PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4
MADV_REMOVE = 9
MADV_POPULATE_WRITE = 23  # Linux 5.14

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_libc.fallocate.restype = ctypes.c_int
_FALLOC_FL_KEEP_SIZE = 0x01
_open = open  # swappable: tests and tools/chaos.py inject an error into a forked writer's first open
_FALLOC_FL_PUNCH_HOLE = 0x02


def madvise(address: int, length: int, advice: int) -> int:
    """madvise(2) on a raw range; returns 0 or the errno (never raises)."""
    if length <= 0:
        return 0
    if _libc.madvise(address, length, advice) == 0:
        return 0
    return ctypes.get_errno()


def punch_hole(fd: int, offset: int, nbytes: int) -> int:
    """Free the whole pages of a file range (a memfd's pages go back to the host); the range
    reads as zeros after. Returns 0 or the errno."""
    start, end = page_up(offset), page_down(offset + nbytes)
    if end <= start:
        return 0
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) == 0:
        return 0
    return ctypes.get_errno()


def address_view(address: int, nbytes: int) -> memoryview:
    """Zero-copy view of ``nbytes`` at a raw address (a CPU storage, a staging buffer)."""
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def page_down(address: int) -> int:
    return address // PAGE * PAGE


def page_up(address: int) -> int:
    return -(-address // PAGE) * PAGE


def merge_ranges(ranges) -> list[tuple[int, int, int]]:
    """Sorted, disjoint (lo, hi, rank); ranges that overlap or touch become one, with the
    lower rank (storages may alias)."""
    merged: list[list[int]] = []
    for lo, hi, rank in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
            merged[-1][2] = min(merged[-1][2], rank)
        else:
            merged.append([lo, hi, rank])
    return [tuple(extent) for extent in merged]


_maps: tuple[int, list[int], list[int]] | None = None  # (pid, starts, ends) of this process's mappings
_frozen = False  # a forked writer's map, read at fork and never again (freeze_maps)


def freeze_maps() -> None:
    """In a forked writer, first thing: read the mappings fork passed on, once for good. The
    writer maps memory of its own as it works (the arena, the codec's buffers), and the kernel
    may place it in a hole that do-not-fork memory left: a map read later would call that
    address mapped, and the writer would save what its own buffer holds there."""
    global _maps, _frozen
    _maps, _frozen = None, False
    _read_maps()
    _frozen = True


def mapped(address: int, nbytes: int) -> bool:
    """Whether [address, address + nbytes) is mapped in this process. A forked writer asks
    before it reads a buffer: memory the parent marked do-not-fork (CUDA's page-locked host
    memory may be) is not in the child, and reading it would kill the writer. The writer's map
    is the one it froze at fork; a process that pickles in place (tests) maps memory between
    calls, and reads its map again on a miss."""
    if nbytes <= 0:
        return True
    if _maps is not None and _maps[0] == os.getpid() and _covered(_maps, address, nbytes):
        return True
    if _frozen and _maps is not None and _maps[0] == os.getpid():
        return False
    return _covered(_read_maps(), address, nbytes)


def _read_maps():
    global _maps
    starts, ends = [], []
    with _open("/proc/self/maps") as f:
        for line in f:
            lo, _, hi = line.split(" ", 1)[0].partition("-")
            starts.append(int(lo, 16))
            ends.append(int(hi, 16))
    _maps = (os.getpid(), starts, ends)
    return _maps


def _covered(maps, address: int, nbytes: int) -> bool:
    _, starts, ends = maps
    i = bisect.bisect_right(starts, address) - 1
    end = address + nbytes
    while 0 <= i < len(starts) and starts[i] <= address:  # contiguous mappings may cover it together
        if ends[i] >= end:
            return True
        if i + 1 >= len(starts) or starts[i + 1] != ends[i]:
            return False
        address = ends[i]
        i += 1
    return False
