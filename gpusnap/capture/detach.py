"""Let go of the trainee's memory early: copy buffers out, then unmap them in the writer.

After fork the trainee and the writer share every page copy-on-write. Adam writes all of its
state every step, so each page the trainee writes while the writer is alive costs a page fault
*and* a 4 KiB copy: about 1 s per GiB on this project's CI machine, whatever the writer does.

The writer therefore works in two phases. Phase 1 (``DetachedBuffers`` as the pickler's sink)
copies every buffer into the writer's own memory at memory speed, while the trainee is still
in its forward and backward pass, then ``release()`` tells the kernel the writer no longer
needs those ranges (``MADV_DONTNEED`` on its private mapping). The trainee's pages are then
its alone again, and its next write to them is a fault without a copy. Phase 2 (``drain``)
hashes, compresses and writes from the copies at idle priority, freeing each as it goes.

The copies are what copy-on-write would have duplicated anyway, so the memory headroom check
before fork covers them. Release happens only after the whole graph is pickled: a numpy array
and a tensor may share memory, and a released range reads back as zeros.
"""

from __future__ import annotations

import ctypes
import mmap
import os

_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class DetachedBuffers:
    """A sink for ``GraphPickler`` that copies now and stores later."""

    def __init__(self):
        self._pending: list[tuple[dict, bytearray, str, int]] = []
        self._ranges: list[tuple[int, int]] = []
        self.nbytes = 0

    def put_buffer(self, view, *, dtype: str, typesize: int) -> dict:
        record: dict = {}
        copy = bytearray(view)  # one memcpy
        self._pending.append((record, copy, dtype, typesize))
        owner = getattr(view, "obj", None)
        if isinstance(owner, ctypes.Array):  # a raw address view (a CPU storage)
            self._ranges.append((ctypes.addressof(owner), len(copy)))
        self.nbytes += len(copy)
        return record

    def release(self) -> int:
        """Unmap the copied ranges from this process; returns bytes released."""
        released = 0
        for address, nbytes in self._ranges:
            start = -(-address // _PAGE) * _PAGE
            end = (address + nbytes) // _PAGE * _PAGE
            if end > start and _libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
                released += end - start
        self._ranges.clear()
        return released

    def drain(self, sink) -> None:
        """Phase 2: store every copy through ``sink``, filling in the records handed out."""
        pending, self._pending = self._pending, []
        for i, (record, copy, dtype, typesize) in enumerate(pending):
            extra = dict(record)
            record.clear()
            record.update(sink.put_buffer(memoryview(copy), dtype=dtype, typesize=typesize))
            record.update(extra)
            pending[i] = None  # free the copy before the next one is compressed
            del copy


def lower_priority(policy: str) -> None:
    """``idle``: run only on cores the trainee leaves idle (SCHED_IDLE); a number: that nice."""
    if policy == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (AttributeError, OSError):
            policy = "19"
    try:
        os.nice(int(policy))
    except (ValueError, OSError):
        pass
