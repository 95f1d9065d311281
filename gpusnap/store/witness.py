"""Witness files: what the iterations after a snapshot did (``graph.witness`` makes them, a
restart compares against them). ``witness/<id>.json`` beside the snapshot's manifest, committed
on its own and replaced by a fuller one as the run goes on; a snapshot without one is still a
good snapshot (its restart is reported unverified). docs/FORMAT.md, "witness/<id>.json"."""

from __future__ import annotations

import json
import pathlib

from gpusnap.store import atomic

DIR = "witness"
# Bounds what a restart believes of a file it reads: a witness is a few kB.
MAX_BYTES = 1 << 20


def path(root, snap_id: str) -> pathlib.Path:
    return pathlib.Path(root) / DIR / f"{snap_id}.json"


def write(root, snap_id: str, data: bytes) -> None:
    """Commit ``data`` (the witness's JSON) as snapshot ``snap_id``'s witness (atomic: the old
    one or the new one)."""
    folder = pathlib.Path(root) / DIR
    if not folder.is_dir():
        atomic.make_dir(folder)
    atomic.write_file(path(root, snap_id), [data])


def read(root, snap_id: str) -> dict | None:
    """Snapshot ``snap_id``'s witness; None when it has none, or one that does not read (a
    damaged witness proves nothing, and the snapshot itself is intact)."""
    try:
        with open(path(root, snap_id), "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != 1 or doc.get("snapshot") != snap_id:
        return None
    if not isinstance(doc.get("iterations"), list) or not all(isinstance(r, dict) for r in doc["iterations"]):
        return None
    loops = doc.get("loops")
    if not loops or not isinstance(loops, list) or not all(isinstance(k, list) and len(k) == 3 for k in loops):
        return None  # no loop to watch: nothing a restart could compare
    return doc


def remove_orphans(root) -> int:
    """Remove the witnesses of snapshots that are gone (retention, gc); how many. Temp files are
    gc's (its sweep of killed writers' debris)."""
    folder = pathlib.Path(root) / DIR
    try:
        names = [n for n in folder.iterdir() if n.suffix == ".json" and not atomic.is_temp(n.name)]
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        snap_id = name.name.split(".", 1)[0]
        if not (pathlib.Path(root) / "snapshots" / f"{snap_id}.json").exists():
            atomic.remove_file(name)
            removed += 1
    if removed:
        atomic.fsync_dir(folder)
    return removed
