"""Drain: the writer's first act, moving large CPU tensor bytes off the pages it shares.

After fork every page of the trainee's tensors is shared copy-on-write with the writer, and the
trainee's first write to each one copies it. The optimizer step right after a snapshot writes
every parameter and every optimizer state page, so in a CPU training process that copying was
most of a snapshot's cost: on the CI machine (2 vCPUs) the first step after fork took +1.4 to
+2.4 s for 1.41 GB of model + Adam state, against +0.2 s once drained
(tools/results/bench_snapshot-cpu-2026-11-21-exp-drainpool.txt).

So the writer copies every CPU storage of at least ``DRAIN_MIN_BYTES`` into its drain region
of the staging arena (``arena``), then drops its own mapping of those pages (MADV_DONTNEED). A
page the writer no longer maps is the trainee's alone, and the trainee's write reuses it in
place. The copies come from the writer's fork-time image, so exactness does not depend on who
gets there first: a page the trainee writes before the drain reaches it is copied the old way,
and the writer still reads the fork-time bytes.

The trainee reserves the region before the fork (``drain_bytes`` says how large: the storages
the optimizers step, or what the last drain wanted), so the region is one of the arena's, never
overlapping device staging or the region an earlier writer may still read. What does not fit
in it stays copy-on-write: slower for the trainee, never wrong.

After the drain, the dropped pages read as zeros *in the writer*: every read of a drained range
must go through ``Drained.view``. The pickler does that for storages and for numpy arrays over
them. Only private anonymous memory is drained (``/proc/self/maps``): dropping a private file
mapping would bring back the file's bytes, and shared memory is never copied on write anyway.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
import os
import sys

from gpusnap import knobs
from gpusnap.errors import CaptureError
from gpusnap.rawmem import MADV_DONTNEED, madvise, merge_ranges, punch_hole, view_at
from gpusnap.stage.arena import Region, writer_view

_ALIGN = 64  # region offsets keep the storages' cache-line alignment


class Drained:
    """Where each drained address range now lives in the writer's drain region."""

    def __init__(self, fd: int = -1, region: Region | None = None):
        self.fd, self.region = fd, region
        self._extents: list[tuple[int, int, int]] = []  # (lo, hi, region offset), disjoint, sorted
        self._counted: list[tuple[int, int, int]] = []  # what ``wanted`` counts, drained or not
        self._view: memoryview | None = None
        self.nbytes = 0  # bytes drained
        self.wanted = 0  # bytes it would have drained with room enough: the next region's size
        self.used = 0  # region bytes taken (extents padded to the alignment)

    def locate(self, lo: int, hi: int) -> tuple[int, int] | None:
        """(extent start, its region offset) when [lo, hi) was drained; None when it was not.

        A range that is only partly drained cannot be read consistently: that raises."""
        i = bisect.bisect_right(self._extents, (lo, float("inf"))) - 1
        if i >= 0 and hi <= self._extents[i][1]:
            start, _, offset = self._extents[i]
            return start, offset
        if self.touches(lo, hi):
            raise CaptureError(
                f"memory at {lo:#x}..{hi:#x} is partly inside a drained tensor storage; "
                "hint: rerun with GPUSNAP_DRAIN=off"
            )
        return None

    def touches(self, lo: int, hi: int, extents=None) -> bool:
        extents = self._extents if extents is None else extents
        i = bisect.bisect_right(extents, (lo, float("inf"))) - 1
        return (i >= 0 and lo < extents[i][1]) or (i + 1 < len(extents) and extents[i + 1][0] < hi)

    def view(self, address: int, nbytes: int) -> memoryview | None:
        """The region's copy of [address, address + nbytes), or None when it was not drained."""
        found = self.locate(address, address + nbytes)
        if found is None:
            return None
        start, offset = found
        return self.region_view()[offset + address - start : offset + address - start + nbytes]

    def region_view(self) -> memoryview:
        """The whole drain region, mapped afresh in this process (once)."""
        if self._view is None:
            self._view = writer_view(self.fd, self.region.offset, self.region.nbytes)
        return self._view

    def take(self, ranges: list[tuple[int, int, int]]) -> bool:
        """Drain (lo, hi, rank) ranges, lowest rank first; False once the region is full."""
        placed, ranges = [], merge_ranges(ranges)
        for lo, hi, rank in ranges:
            self.wanted += hi - lo
            bisect.insort(self._counted, (lo, hi, 0))
            if self.used + hi - lo <= self.region.nbytes:
                placed.append((rank, lo, hi, self.used))
                self.used += -(-(hi - lo) // _ALIGN) * _ALIGN
        for _, lo, hi, offset in sorted(placed):
            if not self._write(offset, view_at(lo, hi - lo)):
                return False  # the host has no memory for the region: the rest stays copy-on-write
            # Whole pages only: the partial pages at either end may hold other allocations.
            with contextlib.suppress(OSError):  # pages not dropped stay copy-on-write: no harm
                madvise(lo, hi - lo, MADV_DONTNEED)
            bisect.insort(self._extents, (lo, hi, offset))
            self.nbytes += hi - lo
        return len(placed) == len(ranges)

    def _write(self, offset: int, data) -> bool:
        """Copy ``data`` to ``offset`` of the region; False when the host cannot give it memory.
        Through the file, not a mapping: no page is faulted in, which makes a drain about 1.8x
        faster (0.14 s per 0.5 GB against 0.25 s for populate + memcpy on the CI machine)."""
        view, position = memoryview(data), self.region.offset + offset
        while len(view):
            try:
                written = os.pwrite(self.fd, view, position)
            except OSError:  # ENOSPC / ENOMEM: no memory for shmem pages
                return False
            view, position = view[written:], position + written
        return True

    def trim(self) -> None:
        """Give back the region's pages past what this drain used (a smaller state than last
        time): the region is this writer's alone until it exits."""
        with contextlib.suppress(OSError):  # pages not given back stay in use: no harm
            punch_hole(self.fd, self.region.offset + self.used, self.region.nbytes - self.used)


def drain(fd: int, region: Region, min_bytes: int, optimizers=()) -> Drained:
    """Copy the large CPU storages into ``region`` of the arena (its memfd ``fd``) and let go
    of their pages (in the writer).

    First the C heap's free pages (``trim_heap``). Then what the ``optimizers`` step (each
    parameter, its grad, its state, in the order of the step), found without a scan, because
    that is the race; then, found by a scan of every object the garbage collector tracks
    (0.1-0.2 s for 300,000 objects), every other CPU storage of at least ``min_bytes``: copies
    the program updates by hand, buffers, data."""
    trim_heap()
    torch = sys.modules.get("torch")
    drained = Drained(fd, region)
    if torch is None:
        return drained
    try:
        spans = _private_anonymous()
    except OSError:  # no /proc: nothing is known to be safe to drop
        return drained

    def wanted(tensors):
        ranges = []
        for rank, tensor in enumerate(tensors):
            found = _cpu_storage(tensor, torch)
            if found and found[1] >= max(min_bytes, 1):
                lo, hi = found[0], found[0] + found[1]
                if _inside(lo, hi, spans) and not drained.touches(lo, hi, drained._counted):
                    ranges.append((lo, hi, rank))  # views repeat a storage: take() merges them
        return ranges

    drained.take(wanted(_step_order(optimizers, torch)))
    drained.take(wanted(_gc_tensors(torch)))  # counted in ``wanted`` even when nothing fits
    if knobs.DRAIN == "keep":
        drained.trim()  # a smaller state than last time: give the rest back
    return drained


def trim_heap() -> None:
    """Let go of the free memory of the C heap (in the writer, before the drain).

    Memory the trainee freed is still mapped, and fork shares it like any other page: the
    allocations of the next step (gradients, an optimizer's temporaries) land on it, and each
    first write copied a page. glibc's malloc_trim(0) drops every whole free page of every
    arena with MADV_DONTNEED; in the writer, which never uses that memory, this makes those
    pages the trainee's alone again. On the CI machine, with the gradients on the heap (0.5 GB
    of model + Adam state): 11 ms, and the step after fork +0.08 s instead of +0.20 s
    (tools/results/bench_snapshot-cpu-2026-11-22-exp-hugepages.txt). No-op outside glibc."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def optimizer_storages(optimizers, min_bytes: int) -> dict[int, int]:
    """{address: nbytes} of the CPU storages of at least ``min_bytes`` the optimizers step."""
    torch = sys.modules["torch"]
    tensors = _step_order(optimizers, torch, grads=False)  # most programs drop grads by the boundary
    storages = dict(filter(None, (_cpu_storage(t, torch) for t in tensors)))
    return {address: n for address, n in storages.items() if n >= min_bytes}


def _cpu_storage(tensor, torch) -> tuple[int, int] | None:
    """(address, nbytes) of a CPU tensor's storage; None for other devices and layouts."""
    try:
        if tensor.device.type != "cpu" or tensor.layout != torch.strided:
            return None
        storage = tensor.untyped_storage()
        address = storage.data_ptr()  # raises for torch.compile's FakeTensors
    except Exception:  # noqa: BLE001 - tensor kinds without a plain storage are not drained
        return None
    return (address, storage.nbytes()) if address else None


def _step_order(optimizers, torch, grads: bool = True):
    """The tensors an optimizer step writes, in the order it writes them."""
    for optimizer in optimizers:
        try:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    yield param
                    if grads and param.grad is not None:
                        yield param.grad
                    for value in optimizer.state.get(param, {}).values():
                        if isinstance(value, torch.Tensor):
                            yield value
        except Exception:  # noqa: BLE001 - an optimizer we cannot read is left to the scan
            continue


def _gc_tensors(torch):
    tensor_types: dict[type, bool] = {}
    for obj in gc.get_objects():
        cls = type(obj)  # not isinstance: that reads __class__, which some proxies warn about
        is_tensor = tensor_types.get(cls)
        if is_tensor is None:
            is_tensor = tensor_types[cls] = issubclass(cls, torch.Tensor)
        if is_tensor:
            yield obj


def _private_anonymous() -> list[tuple[int, int, int]]:
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) > 5 else ""
            if fields[1].startswith("rw") and fields[1][3] == "p" and path in ("", "[heap]"):
                lo, hi = fields[0].split("-")
                spans.append((int(lo, 16), int(hi, 16), 0))
    return merge_ranges(spans)


def _inside(lo: int, hi: int, spans: list[tuple[int, int, int]]) -> bool:
    i = bisect.bisect_right(spans, (lo, float("inf"))) - 1
    return i >= 0 and hi <= spans[i][1]
