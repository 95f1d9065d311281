"""Witness files: what the iterations after a snapshot did (``graph.witness`` makes them, a
restart compares against them). ``witness/<id>.json`` beside the snapshot's manifest, committed
on its own and replaced by a fuller one as the run goes on; a snapshot without one is still a
good snapshot (its restart is reported unverified). docs/FORMAT.md, "witness/<id>.json"."""

from __future__ import annotations

import json

from gpusnap.errors import StoreError
from gpusnap import atomic
from gpusnap.store import backend

DIR = "witness"
# Bounds what a restart believes of a file it reads: a witness is a few kB.
MAX_BYTES = 1 << 20


def key(snap_id: str) -> str:
    return f"{DIR}/{snap_id}.json"


def write(store, snap_id: str, data: bytes) -> None:
    """Commit ``data`` (the witness's JSON) as snapshot ``snap_id``'s witness (atomic: the old
    one or the new one)."""
    backend.of(store).put(key(snap_id), [data])


def read(store, snap_id: str) -> dict | None:
    """Snapshot ``snap_id``'s witness; None when it has none, or one that does not read (a
    damaged witness proves nothing, and the snapshot itself is intact)."""
    try:
        with backend.of(store).open(key(snap_id)) as r:
            raw = r.read(0, MAX_BYTES + 1)
    except (OSError, StoreError):
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


def remove_orphans(store) -> int:
    """Remove the witnesses of snapshots that are gone (retention, gc); how many. Temp files are
    gc's (its sweep of killed writers' debris)."""
    b = backend.of(store)
    try:
        names = [n for n in b.list(DIR) if n.endswith(".json") and not atomic.is_temp(n)]
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        snap_id = name.split(".", 1)[0]
        if not b.exists(f"snapshots/{snap_id}.json"):
            b.delete(f"{DIR}/{name}")
            removed += 1
    if removed:
        b.synced(DIR)
    return removed
