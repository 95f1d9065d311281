"""Raw host memory for the device side: addresses of buffers, views at addresses, and the
mmap/madvise calls the fake device needs (a fixed random base, PROT_NONE reservations,
do-not-fork ranges) that Python's ``mmap`` module cannot make."""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

PAGE = mmap.PAGESIZE
PROT_NONE = 0
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_SHARED = 0x01
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
_MAP_NORESERVE = 0x4000
_MAP_FIXED_NOREPLACE = 0x100000
MADV_DONTFORK = 10
MADV_DOFORK = 11
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def page_up(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


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
        iface = np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8).__array_interface__
    return iface["data"][0]


def view_at(address: int, nbytes: int) -> memoryview:
    """Zero-copy writable view of ``nbytes`` at a raw address."""
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def _mmap(address: int, nbytes: int, prot: int, flags: int) -> int:
    got = _libc.mmap(address or None, nbytes, prot, flags, -1, 0)
    if got in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return got


def map_anywhere(nbytes: int, prot: int = PROT_RW, shared: bool = False) -> int:
    """Fresh anonymous pages; ``shared`` ones can be mapped a second time (``mremap``)."""
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


def unmap(address: int, nbytes: int) -> None:
    _libc.munmap(address, page_up(nbytes))


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


def madvise(address: int, nbytes: int, advice: int) -> None:
    """madvise on the whole pages inside [address, address + nbytes)."""
    start = page_up(address)
    end = (address + nbytes) // PAGE * PAGE
    if end > start and _libc.madvise(start, end - start, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
