"""Raw host memory: views and addresses, page rounding, the mmap/mremap/madvise/fallocate calls
Python's ``mmap`` module cannot make, and the map of what this process has mapped.

One error convention: a call that fails raises ``OSError`` with the errno, as ``os`` does. A
failure cannot then pass unnoticed by a caller that forgot to look at a return code (the two
conventions this module replaces mixed "returns the errno" and "raises"), and the few callers
for whom a failure is an answer (an older kernel without MADV_POPULATE_WRITE or MADV_COLLAPSE,
private memory that cannot be mapped twice) catch it and read ``.errno``. ``map_exactly`` alone
answers None where something is mapped already: that is its question, not a failure.

The floor of the package (as ``errors`` and ``knobs``): the stage, the device backends and the
graph's generator and digest reads all use it.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os

PAGE = mmap.PAGESIZE
PROT_NONE = 0
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
MADV_DONTNEED = 4
MADV_REMOVE = 9
MADV_DONTFORK = 10
MADV_DOFORK = 11
MADV_POPULATE_WRITE = 23  # Linux 5.14
MADV_COLLAPSE = 25  # Linux 6.1
_MAP_SHARED = 0x01
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
_MAP_NORESERVE = 0x4000
_MAP_FIXED_NOREPLACE = 0x100000
_MREMAP_MAYMOVE = 1
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
_libc.mremap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_libc.fallocate.restype = ctypes.c_int
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.mincore.restype = ctypes.c_int
_open = open  # swappable: tests and tools/chaos.py inject an error into a forked writer's first open


def _raise_errno() -> None:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))


# -- addresses and views ---------------------------------------------------------------------
def page_down(address: int) -> int:
    return address // PAGE * PAGE


def page_up(address: int) -> int:
    return -(-address // PAGE) * PAGE


def view_at(address: int, nbytes: int) -> memoryview:
    """Zero-copy writable view of ``nbytes`` at a raw address (a CPU storage, a staging buffer,
    a generator's C state). Made once where it is read often: a ctypes call costs about 0.6 us,
    ``bytes()`` of the view is a memcpy."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def address_of(buffer) -> int:
    """The address of a host buffer as cuda-python accepts one: an int, ``None`` (0), an object
    with ``getPtr()`` (cuda-python's pointer types), or anything with the buffer protocol."""
    if buffer is None:
        return 0
    if isinstance(buffer, int):
        return buffer
    if hasattr(buffer, "getPtr"):
        return int(buffer)
    iface = getattr(buffer, "__array_interface__", None)
    if iface is None:
        # Through NumPy, read-only buffers (bytes, a source) have an address too, as in the
        # real bindings, which take any contiguous buffer.
        import numpy as np

        iface = np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8).__array_interface__
    return iface["data"][0]


def strided_extent(address: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """(lowest address, bytes) of the memory an array of ``shape`` and ``strides`` (in bytes)
    at ``address`` touches: negative strides reach below it; an empty array touches nothing."""
    lo = hi = address
    for n, stride in zip(shape, strides):
        if n == 0:
            return address, 0
        if stride < 0:
            lo += (n - 1) * stride
        else:
            hi += (n - 1) * stride
    return lo, hi + itemsize - lo


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


# -- system calls ----------------------------------------------------------------------------
def madvise(address: int, nbytes: int, advice: int) -> None:
    """madvise(2) on the whole pages inside [address, address + nbytes) (none: nothing to do)."""
    start, end = page_up(address), page_down(address + nbytes)
    if end > start and _libc.madvise(start, end - start, advice) != 0:
        _raise_errno()


def resident(address: int, nbytes: int) -> int:
    """Bytes of the pages of [address, address + nbytes), a page-aligned mapping, that are in
    memory (mincore(2)): of a shared mapping of a memfd, the pages the memfd has, mapped in this
    process yet or not. Faster than asking the memfd with SEEK_DATA/SEEK_HOLE, which walks it
    page by page (136 MiB: 3 ms against 14). Asked 1 GiB at a time, so that the vector stays
    small however large the range."""
    have = 0
    for start in range(address, address + nbytes, _RESIDENT_STEP):
        pages = -(-min(_RESIDENT_STEP, address + nbytes - start) // PAGE)
        vector = (ctypes.c_ubyte * pages)()
        if _libc.mincore(start, pages * PAGE, vector) != 0:
            _raise_errno()
        have += (pages - bytes(vector).count(0)) * PAGE
    return have


_RESIDENT_STEP = 1 << 30


def punch_hole(fd: int, offset: int, nbytes: int) -> None:
    """Free the whole pages of a file range (a memfd's pages go back to the host); the range
    reads as zeros after."""
    start, end = page_up(offset), page_down(offset + nbytes)
    if end > start and _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
        _raise_errno()


def _mmap(address: int, nbytes: int, prot: int, flags: int) -> int:
    got = _libc.mmap(address or None, nbytes, prot, flags, -1, 0)
    if got in (None, _MAP_FAILED):
        _raise_errno()
    return got


def map_anywhere(nbytes: int, prot: int = PROT_RW, shared: bool = False) -> int:
    """Fresh anonymous pages; ``shared`` ones can be mapped a second time (``map_again``)."""
    return _mmap(0, page_up(nbytes), prot, (_MAP_SHARED if shared else _MAP_PRIVATE) | _MAP_ANONYMOUS | _MAP_NORESERVE)


def map_exactly(address: int, nbytes: int, prot: int) -> int | None:
    """Map fresh anonymous pages at exactly ``address``, only if nothing is there (None if
    something is: the kernel's MAP_FIXED_NOREPLACE)."""
    flags = _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED_NOREPLACE
    try:
        got = _mmap(address, page_up(nbytes), prot, flags)
    except FileExistsError:
        return None
    if got != address:  # a kernel before 4.17 takes the flag as a hint only
        unmap(got, nbytes)
        return None
    return got


def map_over(address: int, nbytes: int, prot: int) -> None:
    """Replace pages inside a range this process already mapped (its own reservation)."""
    _mmap(address, page_up(nbytes), prot, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED)


def map_again(address: int, nbytes: int) -> int:
    """A second mapping of the pages of a shared mapping (mremap with old size 0); private
    memory cannot be mapped twice (EINVAL)."""
    got = _libc.mremap(address, 0, nbytes, _MREMAP_MAYMOVE)
    if got in (None, _MAP_FAILED):
        _raise_errno()
    return got


def unmap(address: int, nbytes: int) -> None:
    if _libc.munmap(address, page_up(nbytes)) != 0:
        _raise_errno()


def reserve_random(nbytes: int, align: int = 1 << 21, repeat: bool = False) -> int:
    """A PROT_NONE reservation at a random address: urandom, not `random`, because a replayed
    program restores `random`'s state and must still get a different base. ``repeat``: the
    lowest free one from a fixed address instead, the same in every process that reserves the
    same sizes in the same order (as a GPU's allocator often gives the same addresses)."""
    if repeat:
        step = -(-page_up(nbytes) // align) * align
        for slot in range(4096):
            got = map_exactly(_REPEAT_FROM + slot * step, nbytes, PROT_NONE)
            if got is not None:
                return got
    slots = (0x6000_0000_0000 - 0x1000_0000_0000) // align
    for _ in range(64):
        address = 0x1000_0000_0000 + int.from_bytes(os.urandom(8), "little") % slots * align
        got = map_exactly(address, nbytes, PROT_NONE)
        if got is not None:
            return got
    raise OSError("no free address range for a fake device")


_REPEAT_FROM = 0x2000_0000_0000


# -- what this process has mapped ------------------------------------------------------------
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
