"""Drain: the writer's first act, moving large CPU tensor bytes off the pages it shares.

After fork every page of the trainee's tensors is shared copy-on-write with the writer, and the
trainee's first write to each one copies it. The optimizer step right after a snapshot writes
every parameter and every optimizer state page, so in a CPU training process that copying was
most of a snapshot's cost: on the CI machine (2 vCPUs) the first step after fork took +1.4 to
+2.4 s for 1.41 GB of model + Adam state, against +0.2 s once drained
(tools/results/bench_snapshot-cpu-2026-11-21-exp-drainpool.txt).

So the writer copies CPU storages of at least ``DRAIN_MIN_BYTES`` into its drain region of the
staging arena (``arena``), then drops its own mapping of those pages (MADV_DONTNEED). A page the
writer no longer maps is the trainee's alone, and the trainee's write reuses it in place. The
copies come from the writer's fork-time image, so exactness does not depend on who gets there
first: a page the trainee writes before the drain reaches it is copied the old way, and the
writer still reads the fork-time bytes.

First, at once, what the optimizers step (``drain``): that is the race. Then every other storage
when the writer's pickler reaches it (``Drained.reach``): buffers, copies the program updates by
hand, data. Not by a scan of every object the garbage collector tracks: in a torch program's
300,000 objects that cost each writer 80 ms of CPU and, through the reference counts it wrote, a
private copy of 76 MB of the trainee's pages (19,500 faults), at the trainee's priority; and
what the snapshot does not hold, the trainee is better off copying if it ever writes it.

The trainee reserves the region before the fork (``drain_bytes`` says how large: the storages
the optimizers step, or what the last drain wanted), so the region is one of the arena's, never
overlapping device staging or the region an earlier writer may still read. What does not fit
in it stays copy-on-write: slower for the trainee, never wrong.

After the drain, the dropped pages read as zeros *in the writer*: every read of host memory
goes through ``Drained.view`` (the pickler's ``HostMemory``), and a range something has read in
place is never drained after (``lend``): its reader may still hold the view. pickle itself
reads some objects in place, though (a bytearray, which ``torch.frombuffer`` can put a tensor
over), so what the pickler drains keeps its pages until the pickler is done (``done``), and
what the optimizers step, dropped at once, being the race, is drained only where torch
allocated it. Only private anonymous memory is drained (``/proc/self/maps``): dropping a private
file mapping would bring back the file's bytes, and shared memory is never copied on write
anyway.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import sys

from gpusnap import knobs
from gpusnap.rawmem import MADV_DONTNEED, madvise, merge_ranges, punch_hole, view_at
from gpusnap.stage.arena import Region, writer_view

_ALIGN = 64  # region offsets keep the storages' cache-line alignment
_LENT_BLOCK = 2 << 20  # ranges read in place are looked up by the 2 MiB blocks they cover


class Drained:
    """Where each drained address range now lives in the writer's drain region."""

    def __init__(self, fd: int = -1, region: Region | None = None, min_bytes: int = 1, spans=()):
        self.fd, self.region, self.min_bytes = fd, region, max(min_bytes, 1)
        self._spans = list(spans)  # private anonymous memory, the only kind drained
        self._extents: list[tuple[int, int, int]] = []  # (lo, hi, region offset), disjoint, sorted
        self._counted: list[tuple[int, int, int]] = []  # what ``wanted`` counts, drained or not
        self._lent: dict[int, list[tuple[int, int]]] = {}  # block -> ranges read in place there
        self._to_drop: list[tuple[int, int]] = []  # drained as the pickler reached them: dropped once it is done
        self._view: memoryview | None = None
        self.nbytes = 0  # bytes drained
        self.wanted = 0  # bytes it would have drained with room enough: the next region's size
        self.used = 0  # region bytes taken (extents padded to the alignment)

    def locate(self, lo: int, hi: int) -> tuple[int, int] | None:
        """(extent start, its region offset) when [lo, hi) lies in one drained extent; None
        when it was not drained or only partly (``view`` puts that together)."""
        i = bisect.bisect_right(self._extents, (lo, float("inf"))) - 1
        if i >= 0 and hi <= self._extents[i][1]:
            start, _, offset = self._extents[i]
            return start, offset
        return None

    def touches(self, lo: int, hi: int, extents=None) -> bool:
        extents = self._extents if extents is None else extents
        i = bisect.bisect_right(extents, (lo, float("inf"))) - 1
        return (i >= 0 and lo < extents[i][1]) or (i + 1 < len(extents) and extents[i + 1][0] < hi)

    def view(self, address: int, nbytes: int) -> memoryview | None:
        """The fork-time bytes of [address, address + nbytes) when any of it was drained: in the
        region, or put together from the region and the pages in place (a storage that aliases
        part of a drained one); None when none of it was drained (read it in place)."""
        found = self.locate(address, address + nbytes)
        if found is not None:
            start, offset = found
            return self.region_view()[offset + address - start : offset + address - start + nbytes]
        if not self.touches(address, address + nbytes):
            return None
        whole, at = bytearray(nbytes), address
        first = max(0, bisect.bisect_right(self._extents, (address, float("inf"))) - 1)
        for lo, hi, offset in self._extents[first:]:
            if lo >= address + nbytes:
                break
            if hi <= at:
                continue
            if lo > at:  # a gap: still in place
                whole[at - address : lo - address] = view_at(at, lo - at)
                at = lo
            end = min(hi, address + nbytes)
            whole[at - address : end - address] = self.region_view()[offset + at - lo : offset + end - lo]
            at = end
        if at < address + nbytes:
            whole[at - address :] = view_at(at, address + nbytes - at)
        return memoryview(whole)

    def region_view(self) -> memoryview:
        """The whole drain region, mapped afresh in this process (once)."""
        if self._view is None:
            self._view = writer_view(self.fd, self.region.offset, self.region.nbytes)
        return self._view

    def lend(self, address: int, nbytes: int) -> None:
        """[address, address + nbytes) was read in place: its reader may hold the view, so the
        pages under it must stay. (By block, not in one sorted list: a program may have
        100,000 small tensors, each read in place.)"""
        if self.region is not None and nbytes:
            for block in range(address // _LENT_BLOCK, (address + nbytes - 1) // _LENT_BLOCK + 1):
                self._lent.setdefault(block, []).append((address, address + nbytes))

    def _lent_touches(self, lo: int, hi: int) -> bool:
        for block in range(lo // _LENT_BLOCK, (hi - 1) // _LENT_BLOCK + 1):
            if any(a < hi and lo < b for a, b in self._lent.get(block, ())):
                return True
        return False

    def reach(self, address: int, nbytes: int) -> None:
        """The pickler reached a CPU storage: drain it now if it may be (``_may_take``). Its
        pages are dropped only once the pickler is done (``done``): an object pickle reads in
        place, never through this reader (a bytearray that a tensor lies over, as
        ``torch.frombuffer`` makes), may come after it and must find its bytes."""
        if self._may_take(address, address + nbytes):
            self.take([(address, address + nbytes, 0)], drop=False)

    def ranges(self, tensors) -> list[tuple[int, int, int]]:
        """(lo, hi, rank) of the storages of ``tensors`` that a drain dropping their pages at
        once would take, in their order: not those over memory torch did not allocate (a
        bytearray's, which pickle reads in place)."""
        torch, found = sys.modules["torch"], []
        for rank, tensor in enumerate(tensors):
            storage = _cpu_storage(tensor, torch)
            if storage and _torch_allocated(tensor) and self._may_take(storage[0], storage[0] + storage[1]):
                found.append((storage[0], storage[0] + storage[1], rank))  # views repeat a storage: take() merges them
        return found

    def _may_take(self, lo: int, hi: int) -> bool:
        """[lo, hi) is large enough, private anonymous memory, and nothing of it was counted
        or read in place before."""
        return (self.region is not None and hi - lo >= self.min_bytes and _inside(lo, hi, self._spans)
                and not self.touches(lo, hi, self._counted) and not self._lent_touches(lo, hi))

    def take(self, ranges: list[tuple[int, int, int]], drop: bool = True) -> bool:
        """Drain (lo, hi, rank) ranges, lowest rank first, and drop the writer's pages under
        them (``drop``), else once the pickler is done; False once the region is full."""
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
            if drop:
                _drop(lo, hi)
            else:
                self._to_drop.append((lo, hi))
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

    def done(self) -> None:
        """The pickler is done, so nothing more is drained: drop the pages of what it drained,
        and give back the region's pages past what this writer used (a smaller state than
        last time), when the region stays for the run (it is this writer's alone until it
        exits)."""
        for lo, hi in self._to_drop:
            _drop(lo, hi)
        self._to_drop = []
        if self.region is None or knobs.DRAIN != "keep":
            return
        with contextlib.suppress(OSError):  # pages not given back stay in use: no harm
            punch_hole(self.fd, self.region.offset + self.used, self.region.nbytes - self.used)


def drain(fd: int, region: Region, min_bytes: int, optimizers=()) -> Drained:
    """Copy what the ``optimizers`` step into ``region`` of the arena (its memfd ``fd``) and let
    go of those pages (in the writer); the ``Drained`` takes the program's other large CPU
    storages as the pickler reaches them (``Drained.reach``).

    First the C heap's free pages (``trim_heap``). Then each parameter, its grad and its state,
    in the order of the step, found without a scan, because that is the race."""
    trim_heap()
    if sys.modules.get("torch") is None:
        return Drained()
    try:
        spans = _private_anonymous()
    except OSError:  # no /proc: nothing is known to be safe to drop
        return Drained()
    drained = Drained(fd, region, min_bytes, spans)
    drained.take(drained.ranges(_step_order(optimizers, sys.modules["torch"])))
    return drained


def _drop(lo: int, hi: int) -> None:
    """The writer lets go of its pages of a drained range: the trainee's are its alone then.
    Whole pages only: the partial pages at either end may hold other allocations."""
    with contextlib.suppress(OSError):  # pages not dropped stay copy-on-write: no harm
        madvise(lo, hi - lo, MADV_DONTNEED)


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


def _torch_allocated(tensor) -> bool:
    """Whether torch allocated the tensor's storage: only such a storage can be resized; one
    over another object's memory (``torch.frombuffer``, ``torch.from_numpy``) cannot."""
    try:
        return tensor.untyped_storage().resizable()
    except Exception:  # noqa: BLE001 - kinds without a plain storage are not drained anyway
        return False


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
        except Exception:  # noqa: BLE001 - an optimizer we cannot read is left to the pickler
            continue


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
