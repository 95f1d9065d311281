"""Registered (page-locked) host memory on the fake GPU, by page identity.

``cuMemHostRegister`` pins the *pages* of a range, not its addresses: the GPU copies into and out
of those physical pages until the range is unregistered. When the process replaces a page under
a registered address (a hole punched in the file the range maps, ``MADV_DONTNEED``, a remap),
the mapping shows a fresh page and the GPU goes on writing into the old one, which nothing reads
any more: the writes are lost, and nothing fails. A fake that copied to the address would write
into the fresh page and hide the bug, so a registration here keeps a mapping of its own of the
same pages (``mremap`` with old size 0 duplicates a shared mapping), populated at registration
as pinning populates, and copies go through it. A page of that mapping that is no longer
present (``/proc/self/pagemap``) has been replaced under the program: from then on until
unregistration it is an orphan, and copies into it land in a buffer of the fake's that nothing
else sees, as they would on a GPU.

Only shared mappings can be duplicated; a registered range of private memory is copied at its
address (its pages are not modelled).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from gpusnap import rawmem

PAGE = rawmem.PAGE
_PRESENT = np.uint64(1 << 63)

_pagemap: int | None = None


class Registration:
    """One registered range [address, address + nbytes) and the pages it pinned."""

    def __init__(self, address: int, nbytes: int):
        self.address, self.nbytes = address, nbytes
        self.first_page = address // PAGE * PAGE
        self.span = rawmem.page_up(address + nbytes) - self.first_page
        self.pin = _duplicate(self.first_page, self.span)
        self.orphans: dict[int, np.ndarray] = {}  # page index -> what the GPU wrote into the orphan

    def close(self) -> None:
        if self.pin is not None:
            rawmem.unmap(self.pin, self.span)
            self.pin = None

    def copy_in(self, address: int, source: int, nbytes: int) -> None:
        """A DMA write of ``nbytes`` from ``source`` into the pinned pages at ``address``."""
        for at, target, length in self._pieces(address, nbytes):
            ctypes.memmove(target, source + at, length)

    def copy_out(self, dest: int, address: int, nbytes: int) -> None:
        """A DMA read of ``nbytes`` at ``address`` from the pinned pages into ``dest``."""
        for at, target, length in self._pieces(address, nbytes):
            ctypes.memmove(dest + at, target, length)

    def _pieces(self, address: int, nbytes: int):
        """(offset in the copy, address to copy at, length) over the pages the copy touches."""
        if self.pin is None:
            yield 0, address, nbytes
            return
        first, last = (address - self.first_page) // PAGE, (address + nbytes - 1 - self.first_page) // PAGE
        present = _present(self.pin + first * PAGE, last - first + 1)
        for page in np.flatnonzero(~present) + first:
            self.orphans.setdefault(int(page), np.zeros(PAGE, np.uint8))
        if not any(first <= page <= last for page in self.orphans):
            yield 0, self.pin + address - self.first_page, nbytes
            return
        at = 0
        while at < nbytes:
            offset = address + at - self.first_page
            page, within = divmod(offset, PAGE)
            length = min(PAGE - within, nbytes - at)
            orphan = self.orphans.get(page)
            yield at, (orphan.ctypes.data + within if orphan is not None else self.pin + offset), length
            at += length


def _duplicate(address: int, nbytes: int) -> int | None:
    """A second mapping of the pages of a shared mapping, populated; None for private memory."""
    try:
        got = rawmem.map_again(address, nbytes)
    except OSError:
        return None  # EINVAL: private memory, which cannot be mapped twice
    rawmem.madvise(got, nbytes, rawmem.MADV_DONTFORK)  # the fake's own: no forked child gets it
    try:
        rawmem.madvise(got, nbytes, rawmem.MADV_POPULATE_WRITE)
    except OSError:  # older kernels: fault each page in
        view = np.frombuffer(rawmem.view_at(got, nbytes), np.uint8)
        view[::PAGE] = view[::PAGE]
    return got


def _present(address: int, pages: int) -> np.ndarray:
    """Whether each page from ``address`` is present in this process's page tables (the
    present bit of /proc/self/pagemap, which needs no privilege)."""
    global _pagemap
    if _pagemap is None:
        _pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    entries = np.frombuffer(os.pread(_pagemap, 8 * pages, address // PAGE * 8), "<u8")
    return (entries & _PRESENT) != 0
