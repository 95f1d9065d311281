"""The staging arena: host memory the trainee stages into and its writers read after fork.

One memfd, mapped MAP_SHARED in the trainee, and one allocator that carves it into regions:
device staging (``device``), managed memory (``managed``), pinned CPU tensors (``pinned``),
the CPU drain (``drain``) and the writer's pack windows (``windows``). Regions never overlap.
The memfd is sparse: reserving a region costs nothing, its pages are allocated when first
written (``populate`` does it ahead, between snapshots) and stay for the next snapshot that
reuses the offsets. Because the arena is one
mapping made once, the device code registers it with the GPU once (cuMemHostRegister runs at
~1-2 GB/s: never per snapshot): only its *pinned part* at the top (``pinned``), where the regions
the GPU copies into lie (``DMA_USES``: device and managed staging) and nothing else, grown
downward by doubling. CUDA pins pages, not addresses, so that part is never trimmed or
populated: a page replaced under a registration takes no more of the GPU's copies, and the
writer would read zeros (docs/gpu.md). The drain, the pack windows and the pinned CPU
tensors, which the CPU writes, lie below it, where trimming and populating are safe.

Call order, in the trainee::

    reserve(nbytes, use) -> Region     the regions of the next snapshot (the pending generation;
                                       ``free`` gives one back before the seal)
    seal() -> generation               just before fork: those regions become that generation,
                                       which the forked writer is given with each region
    release(generation)                the writer has exited (done or dead): its regions are free
    discard()                          instead of seal, when the snapshot is skipped

Double buffering follows from it: the regions of a generation whose writer has not exited are
never handed out again, so a snapshot taken while an earlier writer still reads (the release
comes from the waiter thread, which may run after the next safe point) stages elsewhere. The
writer never trusts its inherited mapping (CUDA may mark registered ranges do-not-fork): it
maps its regions afresh from the fd (``writer_view``).

The arena may grow to ``capacity`` (host RAM, the job's memory cgroup limit and
``GPUSNAP_ARENA_BYTES``, whichever is least), and a region is granted only when the pages it
would add fit in the memory left (host memory available, room under the cgroup limit, times
``GPUSNAP_HEADROOM_FRACTION``). Otherwise ``ArenaFull``: one line with the bytes needed and the
limit hit; the snapshot is skipped and training goes on.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from dataclasses import dataclass

from gpusnap import knobs
from gpusnap.errors import ArenaFull, StageError
from gpusnap.stage import limits
from gpusnap.rawmem import MADV_POPULATE_WRITE, PAGE, address_of, madvise, page_up, punch_hole, resident

USES = ("device", "managed", "pinned", "drain", "windows")
DMA_USES = ("device", "managed")  # what the GPU copies into: regions of the pinned part only
_POPULATE_STEP = 8 << 20
_NAMES = {"device": "device staging", "managed": "managed memory", "pinned": "pinned CPU tensors", "drain": "the CPU drain",
          "windows": "the writer's pack windows"}


@dataclass(frozen=True)
class Region:
    """``nbytes`` at ``offset`` of the arena, for ``use``, read by the writer of ``generation``."""

    offset: int
    nbytes: int
    use: str
    generation: int

    def trainee_view(self, arena: "Arena") -> memoryview:
        return arena.view(self.offset, self.nbytes)

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


class Arena:
    """One memfd mapped MAP_SHARED in the trainee; one allocator carves it into regions."""

    def __init__(self, capacity: int | None = None, root: str = "/"):
        host = limits.host_memory(root)
        cgroup = limits.cgroup_memory(root)
        ceilings = [(host.nbytes, host.what)]
        if cgroup is not None:
            ceilings.append((cgroup.nbytes, cgroup.what))
        if capacity is not None:
            ceilings.append((capacity, "its requested size"))
        elif knobs.ARENA_BYTES > 0:
            ceilings.append((knobs.ARENA_BYTES, "GPUSNAP_ARENA_BYTES"))
        nbytes, self.capacity_limit = min(ceilings)
        self.capacity = nbytes // PAGE * PAGE
        self._root = root
        self.fd = os.memfd_create("gpusnap-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, max(self.capacity, PAGE))
        self._map = mmap.mmap(self.fd, max(self.capacity, PAGE), flags=mmap.MAP_SHARED)
        self.address = address_of(self._map)
        # reserve/seal run in the training thread, release in the writer's waiter thread,
        # populate in the preparation thread.
        self._lock = threading.Lock()
        self._regions: list[Region] = []  # every region not released, sorted by offset
        self._pending = 1  # the generation that reserve() hands out and seal() closes
        self.sealed: set[int] = set()  # generations whose writer has not said it is done
        # The pinned part, [pinned_offset, capacity): the regions the GPU copies into, and
        # nothing else, registered with the GPU as one range (``pinned``). It grows downward
        # from the top as device staging needs more, and is never trimmed or populated: a page
        # replaced under a registered range is an orphan the GPU goes on writing into.
        self.pinned_offset = self.capacity

    # -- the allocator -------------------------------------------------------------------------

    def reserve(self, nbytes: int, use: str) -> Region:
        """A region of ``nbytes`` for ``use`` in the pending generation; ``ArenaFull`` when the
        arena cannot hold it (no gap below its capacity, or not memory enough for its pages)."""
        if use not in USES:
            raise ValueError(f"unknown arena use {use!r} (one of {', '.join(USES)})")
        size = page_up(max(nbytes, 1))
        with self._lock:
            if use in DMA_USES:
                offset = self._first_fit(size, self.pinned_offset, self.capacity)
                if offset is None:
                    offset = self._grow_pinned(size, nbytes, use)
            else:
                offset = self._first_fit(size, 0, self.pinned_offset)
            if offset is None:
                held = sum(r.nbytes for r in self._regions)
                busy = f", {held:,} of them held by snapshots in progress" if held else ""
                raise ArenaFull(
                    f"the staging arena cannot hold {nbytes:,} bytes for {_NAMES[use]}: it may grow to "
                    f"{self.capacity:,} bytes ({self.capacity_limit}){busy}",
                    hint=_HINT,
                )
            self._check_room(size - self.populated(offset, size), nbytes, use)
            region = Region(offset, size, use, self._pending)
            self._regions.append(region)
            self._regions.sort(key=lambda r: r.offset)
            return region

    def seal(self) -> int:
        """Just before fork: the regions reserved since the last seal form one generation."""
        with self._lock:
            generation = self._pending
            self._pending += 1
            self.sealed.add(generation)
            return generation

    @property
    def pending(self) -> int:
        """The generation that ``reserve`` hands out now (the next writer's)."""
        return self._pending

    def free(self, region: Region) -> None:
        """Give back one region of the pending generation (reserved ahead, then replaced)."""
        with self._lock:
            if region.generation != self._pending:
                raise ValueError(f"region of generation {region.generation} is sealed: only release() frees it")
            self._regions = [r for r in self._regions if r != region]

    def discard(self) -> None:
        """The snapshot the pending regions were for is not taken: free them."""
        with self._lock:
            self._regions = [r for r in self._regions if r.generation != self._pending]

    def release(self, generation: int) -> None:
        """That generation's writer has exited: its regions may be reused (their pages stay
        allocated for the next snapshot, unless ``GPUSNAP_DRAIN=release``)."""
        with self._lock:
            freed = [r for r in self._regions if r.generation == generation]
            self._regions = [r for r in self._regions if r.generation != generation]
            self.sealed.discard(generation)
        if knobs.DRAIN == "release":
            for region in freed:
                self.trim(region.offset, region.nbytes)

    def regions(self) -> list[Region]:
        with self._lock:
            return list(self._regions)

    def _check_room(self, growth: int, nbytes: int, use: str) -> None:
        """ArenaFull unless ``growth`` more bytes of pages fit in the memory left."""
        limit = self.tightest_room()
        if growth > limit.usable_bytes:
            raise ArenaFull(
                f"the staging arena needs {growth:,} more bytes for {_NAMES[use]} ({nbytes:,} in all), "
                f"but {limit.what} leaves {limit.room_bytes:,} bytes "
                f"(of {limit.nbytes:,}; {knobs.HEADROOM_FRACTION:.0%} may be used)",
                hint=_HINT,
            )

    def _first_fit(self, size: int, lo: int, hi: int) -> int | None:
        """The lowest offset in [lo, hi) where ``size`` bytes fit between the regions."""
        position = lo
        for region in self._regions:
            if region.end <= lo:
                continue
            if region.offset >= hi:
                break
            if region.offset - position >= size:
                return position
            position = max(position, region.end)
        return position if hi - position >= size else None

    def _grow_pinned(self, size: int, nbytes: int, use: str) -> int | None:
        """Grow the pinned part downward so that ``size`` bytes fit at its new bottom: to twice
        its size (registration costs ~1 s per GB: rarely, never per snapshot), or by what is
        missing where that would reach a region of another use or pages the memory left cannot
        hold. The offset of the room made, or None where even that does not fit."""
        top = self.pinned_offset
        lowest = min((r.offset for r in self._regions if r.use in DMA_USES), default=self.capacity)
        below = max((r.end for r in self._regions if r.use not in DMA_USES), default=0)
        least = lowest - size  # just room enough below the lowest region of the pinned part
        if least < below:
            return None
        doubled = 2 * top - self.capacity
        for new in dict.fromkeys((max(min(doubled, least), below), least)):
            try:
                self._check_room(top - new - self.populated(new, top - new), nbytes, use)
            except ArenaFull:
                if new == least:
                    raise
                continue
            self.pinned_offset = new
            return new
        return None

    @property
    def pinned(self) -> tuple[int, int]:
        """(offset, nbytes) of the pinned part: the range to register with the GPU."""
        return self.pinned_offset, self.capacity - self.pinned_offset

    # -- memory ----------------------------------------------------------------------------------

    def tightest_room(self) -> limits.Limit:
        """The ceiling with the least room left: host memory available or the cgroup's."""
        return limits.tightest(self._root)

    def populated(self, offset: int, nbytes: int) -> int:
        """Bytes of [offset, offset + nbytes) (page-aligned, as every region is) that have pages
        already: the memfd's, asked through the trainee's mapping of it (``rawmem.resident``)."""
        return resident(self.address + offset, nbytes)

    def populate(self, region: Region):
        """Allocate the region's pages ahead of the snapshot that writes them, 8 MiB a step
        (an iterator: ``prepare`` runs the steps in its thread), so that no drain pays for
        zeroing fresh pages (about 0.5 s per GB) while it races the trainee.

        MADV_POPULATE_WRITE (Linux 5.14) on a mapping made for the step: it allocates holes
        and leaves pages that exist alone, so a step that runs on while a writer fills the
        region can never zero what it wrote; the temporary mapping keeps the pages out of the
        trainee's resident set. Stops quietly on an older kernel or when the host has no memory
        to give (the drain then allocates what it needs). Never in the pinned part, whose pages
        registration made."""
        position, end = region.offset, min(region.end, self.pinned_offset)
        while position < end:
            length = min(_POPULATE_STEP, end - position)
            if self.populated(position, length) < length:
                try:
                    with mmap.mmap(self.fd, length, flags=mmap.MAP_SHARED, offset=position) as window:
                        madvise(address_of(window), length, MADV_POPULATE_WRITE)
                except (OSError, BufferError, ValueError):
                    return
            position += length
            yield

    def trim(self, offset: int, nbytes: int) -> None:
        """Give back the pages of [offset, offset + nbytes) (whole pages only), never those of
        the pinned part: the GPU would go on writing into the pages taken away."""
        with contextlib.suppress(OSError):  # pages not given back stay in use: no harm
            punch_hole(self.fd, offset, min(offset + nbytes, self.pinned_offset) - offset)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The trainee's view (its own mapping) of [offset, offset + nbytes)."""
        if offset < 0 or offset + nbytes > self.capacity:
            raise ValueError(f"{offset}+{nbytes} is outside the arena ({self.capacity} bytes)")
        return memoryview(self._map)[offset : offset + nbytes]


_HINT = ("raise the job's memory limit or GPUSNAP_ARENA_BYTES, or snapshot with less staged "
         "(GPUSNAP_DRAIN=off stages no CPU tensors); this snapshot is skipped, training goes on")


def writer_view(fd: int, offset: int, nbytes: int) -> memoryview:
    """In a forked writer: [offset, offset + nbytes) of the arena, mapped afresh from the fd.

    Never the inherited mapping: CUDA may have marked it do-not-fork (MADV_DONTFORK after
    cuMemHostRegister), and then the child has nothing there. ``offset`` need not be
    page-aligned; the mapping lives as long as the view."""
    start = offset // PAGE * PAGE
    if nbytes == 0:
        return memoryview(b"")
    mapping = mmap.mmap(fd, offset + nbytes - start, flags=mmap.MAP_SHARED, offset=start)
    return memoryview(mapping)[offset - start :]


_arena: Arena | None = None
_arena_lock = threading.Lock()


def made_arena() -> Arena | None:
    """The trainee's arena if anything has made it yet (a snapshot that stages nothing needs none)."""
    return _arena


def trainee_arena() -> Arena:
    """The trainee's arena, made on first use (a few system calls, no memory)."""
    global _arena
    with _arena_lock:
        if _arena is None:
            try:
                _arena = Arena()
            except OSError as exc:  # no memfd (an old kernel, a seccomp filter), no address space
                raise StageError(f"the staging arena could not be made: {exc.strerror or exc}",
                                 hint="GPUSNAP_DRAIN=off takes CPU snapshots without it") from exc
        return _arena
