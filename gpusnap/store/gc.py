"""Retention and garbage collection.

Order (each step leaves a directory that verifies; see docs/FORMAT.md, "gc")::

    1. remove the manifests of the snapshots beyond --keep      (fsync snapshots/)
    2. compute the chunks the remaining manifests reference
    3. locate each: in an indexed pack, or by scanning a pack no index names (a lost index)
    4. commit ONE new index naming only referenced chunks in the packs kept
    5. remove every older index file                             (fsync index/)
    6. remove the packs the new index does not name               (fsync packs/xx/)
    7. remove temp files whose writer is gone

A crash after step 4 leaves duplicate index entries (harmless: same pack, same offset); a crash
after step 5 leaves packs no index names, which the next gc removes. No step removes a pack that
an index still names, so no manifest is ever left naming a chunk whose pack is gone.
"""

from __future__ import annotations

import os
import pathlib
import time

import psutil

from gpusnap.errors import StoreError, UsageError
from gpusnap.store import atomic, index, pack
from gpusnap.store.check import list_packs
from gpusnap.store.info import utc_now

# A temp file older than this is removed even when its pid is alive again (pid reuse).
_TEMP_MAX_AGE_S = 3600.0


def prune(rd, keep: int | None, drop: list[str] | None = None) -> dict:
    """Keep the newest ``keep`` snapshots (all when None), less those named in ``drop`` (the
    orphan shard snapshots of a sharded directory: ``store.shards``), and remove every chunk,
    pack, index entry and temp file that nothing references. The caller holds the lock or knows that no
    writer runs: gc takes any pack no index names for the debris of a dead writer."""
    if keep is not None and keep < 1:
        raise UsageError("--keep must be at least 1")
    root = pathlib.Path(rd.path)
    rd.check_writable()
    report = {"removed_snapshots": [], "removed_packs": 0, "removed_bytes": 0, "removed_temp": 0,
              "reindexed_chunks": 0, "kept_packs": 0, "kept_unknown": []}

    # 1. retention
    ids = rd.snapshot_ids()
    dropped = set(drop or ())
    ids_left = [sid for sid in ids if sid not in dropped]
    drop = [sid for sid in ids if sid in dropped]
    drop += ids_left[: len(ids_left) - keep] if keep is not None and len(ids_left) > keep else []
    drop.sort()
    for sid in drop:
        atomic.remove_file(root / "snapshots" / f"{sid}.json")
    if drop:
        atomic.fsync_dir(root / "snapshots")
    report["removed_snapshots"] = drop

    # 2. what the remaining manifests need
    referenced: set[str] = set()
    for sid in rd.snapshot_ids():
        try:
            m = rd.load_manifest(sid)
        except StoreError as exc:
            raise StoreError(
                f"gc stops: {exc.message}, so it cannot tell which chunks that snapshot needs",
                hint=f"move {root / 'snapshots' / (sid + '.json')} out of the directory, then run gc again",
            ) from exc
        for rec in m["buffers"].values():
            referenced.update(c for c, _ in rec["chunks"])

    # 3. locate every referenced chunk
    idx = index.load(root)
    on_disk = {pid: path for pid, path in list_packs(root)}
    where: dict[str, pack.Location] = {}
    for cid in referenced:
        loc = idx.chunks.get(cid)
        if loc is not None and loc.pack in on_disk:
            where[cid] = loc
    for pack_id, path in on_disk.items():
        if pack_id in idx.packs:
            continue
        for cid, offset, stored, raw, cd in pack.scan(path):
            if cid in referenced and cid not in where:
                where[cid] = pack.Location(pack_id, offset, stored, raw, cd)
                report["reindexed_chunks"] += 1

    keep_packs: dict[str, list[tuple[str, pack.Location]]] = {}
    for cid, loc in sorted(where.items()):
        keep_packs.setdefault(loc.pack, []).append((cid, loc))
    doomed = [pid for pid in on_disk if pid not in keep_packs]
    # Never remove what this gpusnap cannot read: a newer one may know what such a pack holds.
    unknown = {pid: v for pid in doomed if (v := pack.unknown_version(on_disk[pid])) is not None}
    doomed = [pid for pid in doomed if pid not in unknown]
    report["kept_unknown"] = [
        {"path": str(on_disk[pid].relative_to(root)), "version": v} for pid, v in sorted(unknown.items())
    ]
    entries_now = sum(1 for loc in idx.chunks.values())
    changed = bool(doomed) or bool(idx.unreadable) or report["reindexed_chunks"] or entries_now != len(where) \
        or any(p not in on_disk for p in idx.packs) or len(idx.files) > 1

    # 4–5. one new index, then the old ones go
    if changed:
        sizes = {pid: on_disk[pid].stat().st_size for pid in keep_packs}
        new_name = None
        if keep_packs:
            new_name = index.write(root, "gc", {pid: (sizes[pid], located) for pid, located in keep_packs.items()}, utc_now())
        for name in idx.files + [n for n, _ in idx.unreadable]:
            if name != new_name:
                atomic.remove_file(index.index_dir(root) / name)
        atomic.fsync_dir(index.index_dir(root))

    # 6. packs no index names any more
    dirs = set()
    for pid in doomed:
        path = on_disk[pid]
        report["removed_bytes"] += path.stat().st_size
        atomic.remove_file(path)
        dirs.add(path.parent)
        report["removed_packs"] += 1
    for d in dirs:
        atomic.fsync_dir(d)
        try:
            d.rmdir()  # only succeeds when empty
        except OSError:
            pass
    report["kept_packs"] = len(keep_packs)

    # 7. debris of killed writers
    now = time.time()
    for dirpath, dirs, files in os.walk(root):
        if dirpath == str(root):
            # A distributed run's shards are pruned each as a run directory of its own; the files
            # a restart moved aside (after-<id>/) are the program's, whatever their names.
            dirs[:] = [d for d in dirs if d != "ranks" and not d.startswith("after-")]
        for name in files:
            if not atomic.is_temp(name):
                continue
            path = pathlib.Path(dirpath, name)
            pid = atomic.temp_pid(name)
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if pid is not None and pid != os.getpid() and _alive(pid) and age < _TEMP_MAX_AGE_S:
                continue
            report["removed_bytes"] += path.stat().st_size
            atomic.remove_file(path)
            report["removed_temp"] += 1
    rd._read_index = None
    return report


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
