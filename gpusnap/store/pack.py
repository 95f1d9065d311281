"""Pack files: many chunks in one file, each behind a 32-byte entry header.

A pack is built in one page-aligned window up to knobs.PACK_BYTES (bounded by
knobs.WRITER_WINDOW_BYTES) and then written in one piece through ``atomic.write_file`` with
``direct=True``: the bytes go from the window to the disk without a copy into the page cache,
which on the CI machine costs the writer 0.6-1.2 s of CPU per GB against ~0.05 s. The window is
reused for every pack of a writer.

Its name (``name_of``) is the xxh3-128 of its table of contents: each entry's chunk id, codec,
sizes, offset and, for a compressed entry, the digest of its stored bytes, which the encoder
threads take anyway (``codec.stored_digest``; a raw entry's chunk id is the digest of its bytes).
So the name costs nothing at the flush, and entries may be copied into the window in any order,
by many threads at once, none of them holding a lock or the GIL while it copies (``claim`` then
``fill``): hashing the whole window before its write took 4 ms of every 35 of a pack's turn, and
an encoder at idle priority that hashed and copied its entry in order, under the pipeline's lock,
held every other writer thread back for seconds whenever training preempted it there
(tools/results/writer-priority-inversion-cpu-2026-11-29.txt).

Where a write copies its bytes anyway (tmpfs, and a file system that refuses O_DIRECT, copy them
into the page cache: ``Backend.copies_on_put``), a first copy into a window only doubles the
writer's memory traffic: there the builder is *unwindowed* and hands the store each entry where it
lies, the caller keeping those bytes until the flush (a 1 GB stop snapshot on tmpfs: 0.58 s from
windows, 0.42 s so; tools/results/bench_snapshot-cpu-2026-11-28-1gb-stop-tmpfs-*.txt).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pathlib
import struct
from dataclasses import dataclass

import xxhash

from gpusnap.errors import FormatVersionError, StoreError
from gpusnap import atomic
from gpusnap.rawmem import MADV_POPULATE_WRITE, address_of
from gpusnap.store import backend, codec

PACK_MAGIC = b"GSNPACK\x00"
PACK_VERSION = 1
# magic (8), version u32 LE, reserved u32
PACK_HEADER = struct.Struct("<8sII")
PACK_HEADER_NBYTES = PACK_HEADER.size  # 16
_HEADER_BYTES = PACK_HEADER.pack(PACK_MAGIC, PACK_VERSION, 0)


@dataclass(frozen=True)
class Location:
    """Where one chunk lives: pack id, offset of its entry header, stored and raw sizes, and
    the digest of its stored bytes (``codec.stored_digest``) for a compressed chunk (None: a raw
    chunk, whose id names its stored bytes already, or one indexed before digests existed)."""

    pack: str
    offset: int
    stored_nbytes: int
    raw_nbytes: int
    codec: int
    digest: str | None = None


def pack_key(pack_id: str) -> str:
    return f"packs/{pack_id[:2]}/{pack_id}.pack"


def pack_path(root: pathlib.Path, pack_id: str) -> pathlib.Path:
    return pathlib.Path(root) / pack_key(pack_id)


def name_of(located) -> str:
    """A pack's name: the xxh3-128 of its table of contents, [(chunk id, Location)] in pack order
    (module docstring). ``scan(..., digests=True)`` gives the same table from the pack's bytes."""
    h = xxhash.xxh3_128(_HEADER_BYTES)
    for cid, loc in located:
        h.update(f"{cid} {loc.offset} {loc.stored_nbytes} {loc.raw_nbytes} {loc.codec} {loc.digest or '-'}\n".encode())
    return h.hexdigest()


class PackBuilder:
    """Collects encoded chunks for one pack. Call add() until nbytes is large enough, then
    flush(); flush returns the locations of the chunks it wrote. ``add`` copies the chunk into
    the window at once, so the caller may reuse or release its memory afterwards; unwindowed
    (``windowed=False``), it keeps a reference, and the caller keeps the bytes until the flush.

    Threads that share a builder split ``add`` in two: ``claim`` (under their lock: it only
    reserves the entry's place) and ``fill`` (outside it, any number at once); every claimed
    entry is filled before the flush."""

    def __init__(self, capacity: int, *, windowed: bool = True, memory=None) -> None:
        self._capacity = self.window_nbytes(capacity)
        self._windowed = windowed
        self._memory = memory  # the window's memory when the caller has it (page-aligned), else mapped here
        self._window = None  # allocated on the first add: a reader needs none
        self._base = None  # a ctypes view of the window, for its address (``fill``)
        self._parts: list = []  # unwindowed: each entry's header and stored bytes
        self._pending: list[tuple[str, int, int, int, int, str | None]] = []
        self.nbytes = PACK_HEADER_NBYTES

    @staticmethod
    def window_nbytes(capacity: int) -> int:
        """The window of a pack of at most ``capacity`` bytes of entries: whole pages."""
        return -(-(capacity + PACK_HEADER_NBYTES) // mmap.PAGESIZE) * mmap.PAGESIZE

    def __len__(self) -> int:
        return len(self._pending)

    def fits(self, stored_nbytes: int) -> bool:
        return self.nbytes + codec.ENTRY_NBYTES + stored_nbytes <= self._capacity

    def add(self, cid: str, header: bytes, stored, raw_nbytes: int, digest: str | None = None) -> None:
        """Append one entry; ``digest``: ``codec.stored_digest(stored)`` when the caller has it."""
        offset = self.claim(cid, header, stored, raw_nbytes, digest)
        if offset is not None:
            self.fill(offset, header, stored)

    def claim(self, cid: str, header: bytes, stored, raw_nbytes: int, digest: str | None = None) -> int | None:
        """Take the next entry's place: the offset ``fill`` copies it to, or None unwindowed, where
        the entry is complete (the builder keeps ``stored``)."""
        if not self.fits(len(stored)):
            raise ValueError(f"a {len(stored)}-byte entry does not fit the pack window; flush first")
        codec_id = header[4]
        if codec_id == codec.CODEC_RAW:
            digest = None
        elif digest is None:
            digest = codec.stored_digest(stored)
        start = self.nbytes
        self._pending.append((cid, start, len(stored), raw_nbytes, codec_id, digest))
        self.nbytes = start + codec.ENTRY_NBYTES + len(stored)
        if not self._windowed:
            self._parts += [header, stored]
            return None
        if self._window is None:
            self._allocate()
        return start

    def fill(self, offset: int, header: bytes, stored) -> None:
        """Copy a claimed entry into the window. ``ctypes.memmove`` lets go of the GIL while it
        copies, where a slice assignment holds it."""
        address = ctypes.addressof(self._base) + offset
        ctypes.memmove(address, address_of(header), codec.ENTRY_NBYTES)
        if len(stored):
            ctypes.memmove(address + codec.ENTRY_NBYTES, address_of(stored), len(stored))

    def reserve(self) -> None:
        """Allocate the window now, every page of it. A writer's pipeline reserves its windows
        before its first pack goes to the disk, so that in a memory cgroup too small for them the
        out-of-memory kill comes while no I/O holds the writer's pages: killed in the middle of
        an O_DIRECT write, it kept them pinned, and the kernel went on to kill the program."""
        if self._window is not None or not self._windowed:
            return
        self._allocate()
        if self._memory is not None:
            return  # allocated by its owner
        try:
            self._window.madvise(MADV_POPULATE_WRITE)  # Linux 5.14; Python < 3.12 lacks the name
        except OSError:
            for end in range(mmap.PAGESIZE, self._capacity + 1, mmap.PAGESIZE):
                self._window[end - 1] = 0  # fresh pages are zero: this only faults them in

    def _allocate(self) -> None:
        self._window = _shared_memory(self._capacity) if self._memory is None else self._memory
        self._window[:PACK_HEADER_NBYTES] = _HEADER_BYTES
        self._base = ctypes.c_char.from_buffer(self._window)

    def flush(self, root) -> tuple[str, int, list[tuple[str, Location]]]:
        """Write the pack; return (pack id, pack bytes, [(chunk id, location), ...])."""
        pack_id = name_of((cid, Location("", *entry)) for cid, *entry in self._pending)
        if self._windowed:
            with memoryview(self._window) as window, window[: self.nbytes] as data:
                nbytes = backend.of(root).put(pack_key(pack_id), [data], direct=True)
        else:
            nbytes = backend.of(root).put(pack_key(pack_id), [_HEADER_BYTES, *self._parts])
            self._parts = []
        located = [(cid, Location(pack_id, *entry)) for cid, *entry in self._pending]
        self._pending = []
        self.nbytes = PACK_HEADER_NBYTES
        return pack_id, nbytes, located

    def close(self) -> None:
        self._parts = []
        self._base = None  # its export of the window would keep the window from closing
        if self._window is not None and self._memory is not None:
            self._window = None  # its owner unmaps it
        elif self._window is not None:
            try:
                self._window.close()
            except BufferError:
                pass  # a traceback still holds a view of it; it is unmapped when that goes
            self._window = None


def _shared_memory(nbytes: int) -> mmap.mmap:
    """A pack window: shared memory of a memfd's. Not private memory, although a private page
    costs half as much to fault in and a quarter as much to free: in a memory cgroup too small
    for the window, the kernel killed the program after the writer in 5 runs of 12 with private
    windows, 6 of 23 with anonymous shared ones and 8 of 33 with a memfd's
    (tests/e2e/test_e2e_memory_limits.py, three at once). And a memfd's, not mmap's anonymous
    shared memory: O_DIRECT writes from it ran at 2.9-3.1 GB/s where the same writes from
    anonymous shared memory ran at 2.2-2.7 (16 packs of 64 MiB, six rounds each, alternating,
    three times; private memory: between the two)."""
    fd = os.memfd_create("gpusnap-pack-window", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


class PackReader:
    """Reads entries from packs, keeping one pack open at a time."""

    def __init__(self, root) -> None:
        self._backend = backend.of(root)
        self._pack: str | None = None
        self._handle: backend.Ranged | None = None
        self.size = 0

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle = None
        self._pack = None

    def _select(self, pack_id: str) -> None:
        if self._pack == pack_id:
            return
        self.close()
        self._handle = self._backend.open(pack_key(pack_id))
        self.size = self._handle.size
        self._pack = pack_id
        version = _version(self._handle.read(0, PACK_HEADER_NBYTES))
        if version is not None and version != PACK_VERSION:
            self.close()
            raise FormatVersionError(
                f"pack {pack_id} has pack version {version}; this gpusnap knows pack version {PACK_VERSION}"
            )

    def read_entry(self, loc: Location) -> tuple[bytes, bytes]:
        """Return (entry header, stored bytes). Raises FileNotFoundError when the pack is gone
        and EOFError when it ends before the entry does."""
        self._select(loc.pack)
        want = codec.ENTRY_NBYTES + loc.stored_nbytes
        if loc.offset + want > self.size:  # checked before the read allocates what the index claims
            raise EOFError(f"pack is {self.size} bytes; the entry needs bytes up to {loc.offset + want}")
        buf = self._handle.read(loc.offset, want)
        if len(buf) < want:
            raise EOFError(f"pack is {self.size} bytes; the entry needs bytes up to {loc.offset + want}")
        return buf[: codec.ENTRY_NBYTES], buf[codec.ENTRY_NBYTES :]


def _version(head: bytes) -> int | None:
    """The version a pack header names; None when it is no pack header (damage, which the
    entries' own checks report chunk by chunk)."""
    if len(head) != PACK_HEADER_NBYTES:
        return None
    magic, version, _ = PACK_HEADER.unpack(head)
    return version if magic == PACK_MAGIC else None


def unknown_version(root, key: str) -> int | None:
    """The pack's version when it is a pack of a version this gpusnap does not know (written by
    a newer one), else None. gc keeps such a pack: it cannot tell what it holds."""
    try:
        with backend.of(root).open(key) as r:
            version = _version(r.read(0, PACK_HEADER_NBYTES))
    except (OSError, StoreError):
        return None
    return version if version is not None and version != PACK_VERSION else None


def scan(root, key: str, digests: bool = False):
    """Yield the Location of every well-formed entry of a pack (``digests``: with the digest of
    its stored bytes, which costs reading them; else headers only), with its chunk id first;
    stops at the first damaged header. Used by gc to re-index packs whose index file was lost,
    and to see what a pack holds before it removes the pack."""
    pack_id = key.rsplit("/", 1)[-1].removesuffix(".pack")
    with backend.of(root).open(key) as f:
        if _version(f.read(0, PACK_HEADER_NBYTES)) != PACK_VERSION:
            return
        size = f.size
        offset = PACK_HEADER_NBYTES
        while offset + codec.ENTRY_NBYTES <= size:
            try:
                cd, raw, stored, cid = codec.parse_header(f.read(offset, codec.ENTRY_NBYTES))
            except codec.EntryError:
                return
            if offset + codec.ENTRY_NBYTES + stored > size or not 0 < raw <= codec.MAX_CHUNK_BYTES \
                    or (cd == codec.CODEC_RAW and stored != raw):
                return
            digest = None
            if digests and cd != codec.CODEC_RAW:
                digest = codec.stored_digest(f.read(offset + codec.ENTRY_NBYTES, stored))
            yield cid, Location(pack_id, offset, stored, raw, cd, digest)
            offset += codec.ENTRY_NBYTES + stored


def list_packs(root):
    """(pack id, key) of every pack."""
    b = backend.of(root)
    if b.shared:  # an object store: one listing, not one per prefix
        for key in sorted(b.list_tree("packs")):
            sub, _, name = key.rpartition("/")
            if sub and name.endswith(".pack"):
                yield name[: -len(".pack")], f"packs/{key}"
        return
    try:
        subs = sorted(b.list("packs"))
    except FileNotFoundError:
        return
    for sub in subs:
        if atomic.is_temp(sub):
            continue
        try:
            names = sorted(b.list(f"packs/{sub}"))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if name.endswith(".pack") and not atomic.is_temp(name):
                yield name[: -len(".pack")], f"packs/{sub}/{name}"
