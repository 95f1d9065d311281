"""Index files: which chunk lives where. A writer loads every index at begin_snapshot, so a new
snapshot knows the chunks that exist without reading a single pack."""

from __future__ import annotations

import json
import pathlib
import secrets
from dataclasses import dataclass, field

from gpusnap.errors import FormatVersionError
from gpusnap import atomic
from gpusnap.store import backend, codec
from gpusnap.store.pack import PACK_HEADER_NBYTES, Location, list_packs

INDEX_FORMAT = 1


@dataclass
class Index:
    chunks: dict[str, Location] = field(default_factory=dict)
    packs: dict[str, int] = field(default_factory=dict)  # pack id -> pack nbytes
    files: list[str] = field(default_factory=list)
    # (file name, message) for index files that could not be read
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    live_packs: set[str] | None = None  # the packs on disk when it was loaded (None: not looked at)

    def add(self, cid: str, loc: Location) -> None:
        # Duplicates across index files are allowed (gc writes the new index before it
        # removes the old ones); the first one read wins, and both point at valid data. An
        # entry whose pack is gone (gc removes a pack that holds no chunk a snapshot needs
        # before it rewrites the index: a full disk) gives way to one whose pack is there.
        held = self.chunks.get(cid)
        if held is None or (self.live_packs is not None and held.pack not in self.live_packs and loc.pack in self.live_packs):
            self.chunks[cid] = loc

    def live(self) -> dict[str, Location]:
        """The chunks whose pack is on disk: the only ones a writer may name without writing them."""
        if self.live_packs is None:
            return dict(self.chunks)
        return {cid: loc for cid, loc in self.chunks.items() if loc.pack in self.live_packs}


DIR = "index"


def index_dir(root: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(root) / DIR


def load(root) -> Index:
    b = backend.of(root)
    idx = Index(live_packs={pid for pid, _ in list_packs(b)})
    try:
        names = sorted(b.list(DIR))
    except FileNotFoundError:
        return idx
    for name in names:
        if atomic.is_temp(name) or not name.endswith(".json"):
            continue
        try:
            entries = _read(b, f"{DIR}/{name}")
        except FormatVersionError:
            raise
        except FileNotFoundError:
            continue  # gc replaced it between the listing and the read: its new one is listed too, or reads next time
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            idx.unreadable.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        idx.files.append(name)
        _add(idx, entries)
    return idx


def load_file(root, name: str) -> Index | None:
    """One index file as an Index of its own; None when it cannot be read."""
    idx = Index(files=[name])
    try:
        _add(idx, _read(backend.of(root), f"{DIR}/{name}"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return idx


def _add(idx: Index, entries: list) -> None:
    for cid, item in entries:
        if cid is None:
            idx.packs[item[0]] = item[1]
        else:
            idx.add(cid, item)


def _read(b: backend.Backend, key: str) -> list:
    """[(chunk id, Location)] and [(None, (pack id, pack nbytes))] of one index file."""
    doc = json.loads(b.get(key))
    fmt = doc.get("format")
    if fmt != INDEX_FORMAT:
        raise FormatVersionError(f"index file {b.location}/{key} has format {fmt!r}; this gpusnap knows format {INDEX_FORMAT}")
    entries = []
    for pack_id, pack in doc["packs"].items():
        nbytes = _count(pack["nbytes"], "pack nbytes", PACK_HEADER_NBYTES)
        if not codec.is_digest(pack_id, 32):
            raise ValueError(f"pack id {pack_id!r} is not 32 hex digits")
        for entry in pack["chunks"]:
            entries.append(_entry(pack_id, nbytes, entry))
        entries.append((None, (pack_id, nbytes)))
    return entries


def _count(value, what: str, least: int = 0, most: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least or (most is not None and value > most):
        raise ValueError(f"{what} {value!r} is not a whole number from {least} to {most if most is not None else 'any'}")
    return value


def _entry(pack_id: str, pack_nbytes: int, entry) -> tuple[str, Location]:
    """One chunk's entry, its fields checked against each other and the pack's size before
    anything is read or allocated by them (ValueError: the index file is damaged)."""
    if not isinstance(entry, list) or len(entry) not in (5, 6):
        raise ValueError(f"chunk entry {entry!r} is not [id, offset, stored, raw, codec(, digest)]")
    cid, offset, stored, raw, codec_id, *digest = entry
    digest = digest[0] if digest else None
    if not codec.is_digest(cid, 32):
        raise ValueError(f"chunk id {cid!r} is not 32 hex digits")
    offset = _count(offset, f"chunk {cid}: offset", PACK_HEADER_NBYTES)
    stored = _count(stored, f"chunk {cid}: stored size", 0, pack_nbytes - offset - codec.ENTRY_NBYTES)
    raw = _count(raw, f"chunk {cid}: raw size", 1, codec.MAX_CHUNK_BYTES)
    if codec_id not in (codec.CODEC_RAW, codec.CODEC_BLOSC2) or isinstance(codec_id, bool):
        raise ValueError(f"chunk {cid}: codec {codec_id!r} is unknown")
    if codec_id == codec.CODEC_RAW and stored != raw:
        raise ValueError(f"chunk {cid}: stored raw in {stored} bytes, but {raw} long")
    if digest is not None and not codec.is_digest(digest, 16):
        raise ValueError(f"chunk {cid}: digest {digest!r} is not 16 hex digits")
    return cid, Location(pack_id, offset, stored, raw, codec_id, digest)


def write(root, prefix: str, packs: dict[str, tuple[int, list[tuple[str, Location]]]], created: str) -> str:
    """Commit one index file naming ``packs`` {pack id: (nbytes, [(chunk id, location)])};
    return its file name. Names are unique so no index file is ever replaced."""
    doc = {
        "format": INDEX_FORMAT,
        "created": created,
        "snapshot": prefix if prefix != "gc" else None,
        "packs": {
            pack_id: {
                "nbytes": nbytes,
                "chunks": [[cid, loc.offset, loc.stored_nbytes, loc.raw_nbytes, loc.codec]
                           + ([loc.digest] if loc.digest is not None else []) for cid, loc in located],
            }
            for pack_id, (nbytes, located) in sorted(packs.items())
        },
    }
    name = f"{prefix}-{secrets.token_hex(4)}.json"
    backend.of(root).put(f"{DIR}/{name}", [json.dumps(doc, indent=1).encode()])
    return name
