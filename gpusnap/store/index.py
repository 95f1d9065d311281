"""Index files: which chunk lives where. A writer loads every index at begin_snapshot, so a new
snapshot knows the chunks that exist without reading a single pack."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
from dataclasses import dataclass, field

from gpusnap.errors import FormatVersionError
from gpusnap.store import atomic
from gpusnap.store.pack import Location

INDEX_FORMAT = 1


@dataclass
class Index:
    chunks: dict[str, Location] = field(default_factory=dict)
    packs: dict[str, int] = field(default_factory=dict)  # pack id -> pack nbytes
    files: list[str] = field(default_factory=list)
    # (file name, message) for index files that could not be read
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    def add(self, cid: str, loc: Location) -> None:
        # Duplicates across index files are allowed (gc writes the new index before it
        # removes the old ones); the first one read wins, and both point at valid data.
        self.chunks.setdefault(cid, loc)


def index_dir(root: pathlib.Path) -> pathlib.Path:
    return root / "index"


def load(root: pathlib.Path) -> Index:
    idx = Index()
    d = index_dir(root)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return idx
    for name in names:
        if atomic.is_temp(name) or not name.endswith(".json"):
            continue
        try:
            with open(d / name, "rb") as f:
                doc = json.loads(f.read())
            fmt = doc.get("format")
            if fmt != INDEX_FORMAT:
                raise FormatVersionError(
                    f"index file {d / name} has format {fmt!r}; this gpusnap knows format {INDEX_FORMAT}"
                )
            entries = []
            for pack_id, pack in doc["packs"].items():
                nbytes = int(pack["nbytes"])
                for cid, offset, stored, raw, codec_id in pack["chunks"]:
                    entries.append((str(cid), Location(pack_id, int(offset), int(stored), int(raw), int(codec_id))))
                entries.append((None, (pack_id, nbytes)))
        except FormatVersionError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            idx.unreadable.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        idx.files.append(name)
        for cid, item in entries:
            if cid is None:
                idx.packs[item[0]] = item[1]
            else:
                idx.add(cid, item)
    return idx


def write(root: pathlib.Path, prefix: str, packs: dict[str, tuple[int, list[tuple[str, Location]]]], created: str) -> str:
    """Commit one index file naming ``packs`` {pack id: (nbytes, [(chunk id, location)])};
    return its file name. Names are unique so no index file is ever replaced."""
    doc = {
        "format": INDEX_FORMAT,
        "created": created,
        "snapshot": prefix if prefix != "gc" else None,
        "packs": {
            pack_id: {
                "nbytes": nbytes,
                "chunks": [[cid, loc.offset, loc.stored_nbytes, loc.raw_nbytes, loc.codec] for cid, loc in located],
            }
            for pack_id, (nbytes, located) in sorted(packs.items())
        },
    }
    name = f"{prefix}-{secrets.token_hex(4)}.json"
    atomic.make_dir(index_dir(root))
    atomic.write_file(index_dir(root) / name, [json.dumps(doc, indent=1).encode()])
    return name
