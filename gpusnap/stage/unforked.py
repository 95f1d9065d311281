"""Host memory that fork does not pass on: staged by the parent, read by the writer from the arena.

CUDA's page-locked host memory (``tensor.pin_memory()``, a ``DataLoader(pin_memory=True)``'s
batches, ``cudaHostAlloc``) must not be used by a forked child, and memory marked do-not-fork
(MADV_DONTFORK: VmFlags ``dc`` in /proc/self/smaps) is simply absent there; a writer reading
either would die or read garbage. So in the stall the trainee copies what the snapshot needs of
it into the ``pinned`` region of the staging arena, and the writer reads those bytes there.

What it needs: the CPU tensors and numpy arrays that the frames on the snapshot's path hold in
their locals, directly or inside lists, tuples, dicts and mappings of a few hundred items at
most (a batch ``x, y``, the ``inputs`` dict a trainer's loop keeps, a list of micro-batches), whose memory is page-locked
(``Tensor.is_pinned()``) or lies in a do-not-fork mapping. That walk is shallow on purpose: it
runs in the stall, and pinned memory deeper in the program's objects is rare; the writer checks
every buffer it reads (``rawmem.mapped``) and fails the snapshot, with a hint, rather than read
what the fork did not pass on. Also every open cuda.core Buffer over host memory (a
``LegacyPinnedMemoryResource``'s or ``PinnedMemoryResource``'s, found by ``sources.core_ranges``,
which runs first in the stall, after the devices were synchronized): whole, at every snapshot.

The do-not-fork mappings come from /proc/self/smaps, read once per process
(``dontfork_ranges``).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpusnap.traverse import walk

_DEPTH = 4  # containers inside containers inside a local
_WIDTH = 256  # a batch is a few tensors: a longer container (a list of losses) is not looked into

_ranges: list | None = None  # read once per process: see dontfork_ranges


def dontfork_ranges(refresh: bool = False) -> list[tuple[int, int]]:
    """[lo, hi) of every readable mapping flagged do-not-fork (``dc``), except device I/O.

    Read from /proc/smaps once per process (4 ms for 400 mappings here, more in a CUDA
    process), not at every snapshot: a training process maps and unmaps memory every step, and
    the one do-not-fork memory its locals hold in practice is CUDA's pinned memory, which
    ``Tensor.is_pinned()`` finds without it. Do-not-fork memory mapped later is caught by the
    writer's check (``rawmem.mapped``)."""
    global _ranges
    if _ranges is None or refresh:
        _ranges = [(lo, hi) for lo, hi, perms, flags in mappings()
                   if "dc" in flags and "r" in perms and not {"io", "pf"} & set(flags)]
    return _ranges


def mappings():
    """(lo, hi, perms, vmflags) of each mapping of this process, from /proc/self/smaps."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, _, hi = head.partition("-")
                current = (int(lo, 16), int(hi, 16), line.split()[1])
            elif head == "VmFlags:" and current is not None:
                yield (*current, line.split()[1:])
                current = None


def vmflags(address: int) -> str:
    """The VmFlags of the mapping holding ``address`` ("dc": fork does not pass it on), or "?"."""
    return next((" ".join(flags) for lo, hi, _, flags in mappings() if lo <= address < hi), "?")


def _inside(ranges, address: int, nbytes: int) -> bool:
    return any(lo <= address and address + nbytes <= hi for lo, hi in ranges)


def held_by(frames, ranges) -> list[tuple[int, int]]:
    """(address, nbytes) of the unforked buffers the frames' locals hold, each once."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    cuda = torch is not None and torch.cuda.is_initialized()
    found: dict[int, int] = {}

    def expand(value, depth: int):
        if torch is not None and isinstance(value, torch.Tensor):
            return  # a leaf, looked at in the loop
        if np is not None and isinstance(value, np.ndarray):
            return
        if depth >= _DEPTH or (isinstance(value, (list, tuple, dict, Mapping)) and _length(value) > _WIDTH):
            return
        if isinstance(value, (list, tuple)):
            yield from ((item, depth + 1) for item in value)
        elif isinstance(value, (dict, Mapping)):
            try:
                yield from ((item, depth + 1) for item in value.values())
            except Exception:  # noqa: BLE001 - a mapping whose values() misbehaves holds nothing for us
                pass

    roots = [(value, 0) for frame in frames for value in frame.f_locals.values()]
    for value, _depth in walk(roots, expand):
        if torch is not None and isinstance(value, torch.Tensor):
            value = getattr(value, "_local_tensor", value)  # a DTensor's bytes are its local shard's
            if value.device.type == "cpu" and value.layout == torch.strided:
                storage = value.untyped_storage()
                address, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and ((cuda and value.is_pinned()) or _inside(ranges, address, nbytes)):
                    found[address] = max(found.get(address, 0), nbytes)
        elif np is not None and isinstance(value, np.ndarray):
            base = value
            while isinstance(base.base, np.ndarray):
                base = base.base
            address = base.__array_interface__["data"][0]
            if base.nbytes and _inside(ranges, address, base.nbytes):
                found[address] = max(found.get(address, 0), base.nbytes)
    return sorted(found.items())


def _length(value) -> int:
    try:
        return len(value)
    except Exception:  # noqa: BLE001 - a mapping without a length is not looked into
        return _WIDTH + 1


@dataclass
class Unforked:
    """What the writer needs of the unforked buffers: {address: (arena offset, nbytes)}."""

    copies: dict = field(default_factory=dict)
    arena_fd: int = -1

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.copies.values())

    def view(self, address: int, nbytes: int):
        """The writer's view of [address, address + nbytes) from the arena, or None."""
        from gpusnap.stage.arena import writer_view

        for start, (at, length) in self.copies.items():
            if start <= address and address + nbytes <= start + length:
                return writer_view(self.arena_fd, at + address - start, nbytes)
        return None


def stage_unforked(frames) -> Unforked | None:
    """In the stall: copy the unforked buffers the frames hold, and cuda.core's host Buffers, into
    the arena's ``pinned`` region. None when there are none (the common case, decided by the
    do-not-fork ranges read once per process)."""
    from gpusnap.stage.sources import core_host_buffers

    ranges = dontfork_ranges()
    torch = sys.modules.get("torch")
    core = core_host_buffers()
    if not ranges and not core and not (torch is not None and torch.cuda.is_initialized()):
        return None
    from gpusnap.stage.arena import trainee_arena

    arena = trainee_arena()
    arena_lo = arena.address
    ranges = [(lo, hi) for lo, hi in ranges if not (lo <= arena_lo < hi)]
    held = dict(held_by(frames, ranges))
    for address, nbytes in core:
        held[address] = max(held.get(address, 0), nbytes)
    held = sorted(held.items())
    if not held:
        return None
    region = arena.reserve(sum(n for _, n in held), "pinned")
    unforked = Unforked(arena_fd=arena.fd)
    at = region.offset
    for address, nbytes in held:
        ctypes.memmove(arena.address + at, address, nbytes)
        unforked.copies[address] = (at, nbytes)
        at += nbytes
    return unforked
