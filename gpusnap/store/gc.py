"""Retention and garbage collection.

Order (each step leaves a directory that verifies; see docs/FORMAT.md, "gc")::

    1. remove the manifests of the snapshots beyond --keep      (fsync snapshots/), then the
       witnesses of snapshots that are gone                    (fsync witness/)
    2. compute the chunks the remaining manifests reference
    3. free what needs no write: temp files whose writer is gone, packs that hold no
       referenced chunk (fsync packs/xx/), index files that name no referenced chunk
       (fsync index/)
    4. locate each referenced chunk: in an indexed pack, or by scanning a pack no index names
       (a lost index); copy the live chunks of a pack that is mostly dead into a new pack
       (``_repack``), which step 7 then removes
    5. commit ONE new index naming only referenced chunks in the packs kept
    6. remove every older index file                             (fsync index/)
    7. remove the packs the new index does not name               (fsync packs/xx/)

Step 3 is what a full disk needs: everything before step 5 only removes files, so gc frees the
space of the pruned snapshots even when no byte can be written; when step 5 then finds no room
it stops there (``report["no_room"]``), with a directory that verifies. A pack removed in step
3 may still be named by an index file that also names chunks in use: those entries are dead
until step 5 rewrites the index (``index.Index`` prefers a live entry, the writer never reuses a
dead one). A crash after step 5 leaves duplicate index entries (harmless: same pack, same
offset); a crash after step 6 leaves packs no index names, which the next gc removes. No step
removes a pack that holds a chunk a remaining manifest names, so no manifest is ever left naming
a chunk whose pack is gone.
"""

from __future__ import annotations

import os
import pathlib
import time

from gpusnap import atomic, lifeline
from gpusnap.errors import NoSpace, StoreError, UsageError
from gpusnap.store import codec, index, pack, witness
from gpusnap.store.info import AFTER, by_number, utc_now
from gpusnap.store.pack import list_packs
from gpusnap.store.reader import ChunkProblem, load_chunk

# A temp file older than this is removed even when its pid is alive again (pid reuse).
_TEMP_MAX_AGE_S = 3600.0


def prune(rd, keep: int | None, drop: list[str] | None = None) -> dict:
    """Keep the newest ``keep`` snapshots (all when None), less those named in ``drop`` (the
    orphan shard snapshots of a sharded directory: ``store.shards``), and remove every chunk,
    pack, index entry and temp file that nothing references. The caller holds the lock or knows that no
    writer runs: gc takes any pack no index names for the debris of a dead writer."""
    if keep is not None and keep < 1:
        raise UsageError("--keep must be at least 1")
    root, b = rd.path, rd.backend
    rd.check_writable()
    report = {"removed_snapshots": [], "removed_packs": 0, "removed_bytes": 0, "removed_temp": 0,
              "reindexed_chunks": 0, "repacked_packs": 0, "kept_packs": 0, "kept_unknown": [], "no_room": False}

    # 1. retention
    ids = rd.snapshot_ids()
    dropped = set(drop or ())
    ids_left = [sid for sid in ids if sid not in dropped]
    drop = [sid for sid in ids if sid in dropped]
    drop += ids_left[: len(ids_left) - keep] if keep is not None and len(ids_left) > keep else []
    drop = by_number(drop)
    for sid in drop:
        b.delete(f"snapshots/{sid}.json")
    if drop:
        b.synced("snapshots")
    report["removed_snapshots"] = drop
    witness.remove_orphans(b)

    # 2. what the remaining manifests need
    referenced: set[str] = set()
    for sid in rd.snapshot_ids():
        try:
            m = rd.load_manifest(sid)
            try:
                referenced.update(str(c) for rec in m["buffers"].values() for c, _ in rec["chunks"])
            except (AttributeError, KeyError, TypeError, ValueError):
                raise StoreError(f"the manifest of snapshot {sid} has a damaged buffer record") from None
        except StoreError as exc:
            raise StoreError(
                f"gc stops: {exc.message}, so it cannot tell which chunks that snapshot needs",
                hint=f"move {root / 'snapshots' / (sid + '.json')} out of the directory, then run gc again",
            ) from exc

    # 3. free what needs no write
    if rd.local:  # an object store has no temp files: its puts are whole or nothing
        _remove_temp(root, report)
    idx = _remove_unreferenced(b, referenced, report)

    # 4. locate every referenced chunk
    on_disk = {pid: key for pid, key in list_packs(b)}
    where: dict[str, pack.Location] = {}
    for cid in referenced:
        loc = idx.chunks.get(cid)
        if loc is not None and loc.pack in on_disk:
            where[cid] = loc
    for pack_id, key in on_disk.items():
        if pack_id in idx.packs:
            continue
        for cid, loc in pack.scan(b, key, digests=True):
            if cid in referenced and cid not in where:
                where[cid] = loc
                report["reindexed_chunks"] += 1

    keep_packs: dict[str, list[tuple[str, pack.Location]]] = {}
    for cid, loc in sorted(where.items()):
        keep_packs.setdefault(loc.pack, []).append((cid, loc))
    _repack(b, on_disk, keep_packs, report)
    doomed = [pid for pid in on_disk if pid not in keep_packs]
    # Never remove what this gpusnap cannot read: a newer one may know what such a pack holds.
    unknown = {pid: v for pid in doomed if (v := pack.unknown_version(b, on_disk[pid])) is not None}
    doomed = [pid for pid in doomed if pid not in unknown]
    report["kept_unknown"] = [
        {"path": on_disk[pid], "version": v} for pid, v in sorted(unknown.items())
    ]
    entries_now = sum(1 for loc in idx.chunks.values())
    changed = bool(doomed) or bool(idx.unreadable) or report["reindexed_chunks"] or entries_now != len(where) \
        or any(p not in on_disk for p in idx.packs) or len(idx.files) > 1

    # 5–6. one new index, then the old ones go
    if changed:
        sizes = {pid: b.size(on_disk[pid]) for pid in keep_packs}
        new_name = None
        if keep_packs:
            try:
                new_name = index.write(b, "gc", {pid: (sizes[pid], located) for pid, located in keep_packs.items()}, utc_now())
            except NoSpace:
                # A disk full even after step 3: what is left is consistent, and the next gc,
                # with room for one index file, finishes the job.
                report["no_room"] = True
                report["kept_packs"] = len(on_disk)
                rd._read_index = None
                return report
        for name in idx.files + [n for n, _ in idx.unreadable]:
            if name != new_name:
                b.delete(f"{index.DIR}/{name}")
        b.synced(index.DIR)

    # 7. packs no index names any more
    _remove_packs(b, [on_disk[pid] for pid in doomed], report)
    report["kept_packs"] = len(keep_packs)
    rd._read_index = None
    return report


# A pack is repacked when more of it is dead than alive, and at least this much.
_REPACK_MIN_DEAD_BYTES = 1 << 20


def _repack(b, on_disk: dict, keep_packs: dict, report: dict) -> None:
    """Copy the live chunks of each mostly dead pack into a new pack, and let ``keep_packs``
    name that one instead: gc does not otherwise split a pack, and a few small buffers that never
    change (an unused RNG's state, a frozen bias) would keep the first snapshot's whole pack for
    the life of the run. Each copy is checked against its id before it is written. Needs room
    for the live bytes only; a pack that cannot be copied (no room, a damaged chunk) stays."""
    for pid, located in list(keep_packs.items()):
        size = b.size(on_disk[pid])
        live = pack.PACK_HEADER_NBYTES + sum(codec.ENTRY_NBYTES + loc.stored_nbytes for _, loc in located)
        if size - live < max(live, _REPACK_MIN_DEAD_BYTES):
            continue
        reader, builder = pack.PackReader(b), pack.PackBuilder(live)
        try:
            for cid, loc in located:
                load_chunk(reader, index.Index(chunks={cid: loc}), cid, loc.raw_nbytes)
                header, stored = reader.read_entry(loc)
                builder.add(cid, header, stored, loc.raw_nbytes)
            new_pid, _, moved = builder.flush(b)
        except (ChunkProblem, OSError, NoSpace):
            continue
        finally:
            reader.close()
            builder.close()
        del keep_packs[pid]
        keep_packs[new_pid] = moved
        on_disk[new_pid] = pack.pack_key(new_pid)
        report["repacked_packs"] += 1


def _remove_temp(root: pathlib.Path, report: dict) -> None:
    """Temp files of writers that are gone (a killed writer's half-written pack is the largest
    thing a full disk may hold that nothing needs)."""
    now = time.time()
    for dirpath, dirs, files in os.walk(root):
        if dirpath == str(root):
            # A distributed run's shards are pruned each as a run directory of its own; the files
            # a restart moved aside (after-<id>/) are the program's, whatever their names.
            dirs[:] = [d for d in dirs if d != "ranks" and not d.startswith(AFTER)]
        for name in files:
            if not atomic.is_temp(name):
                continue
            path = pathlib.Path(dirpath, name)
            pid = atomic.temp_pid(name)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if pid is not None and pid != os.getpid() and lifeline.alive(pid) and now - st.st_mtime < _TEMP_MAX_AGE_S:
                continue
            atomic.remove_file(path)
            report["removed_bytes"] += st.st_size
            report["removed_temp"] += 1


def _remove_unreferenced(b, referenced: set[str], report: dict) -> index.Index:
    """Remove, writing nothing (so this frees a full disk), the packs that hold no referenced
    chunk (what their index entries say; a pack no index names, what its headers say), then
    the index files that name no referenced chunk. An index file that names some referenced
    chunks may still name a pack removed here: its entries for that pack are dead (readers
    prefer a live entry for the same chunk, writers never reuse a dead one) until steps 5-6
    rewrite the index. Returns the index as it is left."""
    idx = index.load(b)
    held: dict[str, set[str]] = {}
    for cid, loc in idx.chunks.items():
        held.setdefault(loc.pack, set()).add(cid)
    for name in idx.files:  # every entry, not only the first of a chunk named twice
        one = index.load_file(b, name)
        for cid, loc in (one.chunks.items() if one is not None else ()):
            held.setdefault(loc.pack, set()).add(cid)
    empty = []
    for pid, key in list_packs(b):
        if pack.unknown_version(b, key) is not None:
            continue
        chunks = held[pid] if pid in held else {cid for cid, _ in pack.scan(b, key)}
        if not chunks & referenced:
            empty.append(key)
    _remove_packs(b, empty, report)
    gone = [name for name in idx.files if (one := index.load_file(b, name)) is not None and not set(one.chunks) & referenced]
    for name in gone:
        b.delete(f"{index.DIR}/{name}")
    if gone:
        b.synced(index.DIR)
    return index.load(b) if empty or gone else idx


def _remove_packs(b, keys: list[str], report: dict) -> None:
    dirs = set()
    for key in keys:
        report["removed_bytes"] += b.size(key)
        b.delete(key)
        dirs.add(key.rsplit("/", 1)[0])
        report["removed_packs"] += 1
    for d in dirs:
        b.synced(d, drop_empty=True)


