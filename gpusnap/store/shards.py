"""Sharded run directories: one torchrun job, one shard per rank, global snapshots over them.

Layout (docs/FORMAT.md, "Sharded run directories")::

    DIR/run.json                 identity; "dist" says the directory is sharded
    DIR/snapshots/<id>.json      global manifests: which shard snapshot of each rank belongs
                                 to global snapshot <id> (no buffers of their own)
    DIR/ranks/<rank>/            one ordinary run directory per rank: run.json, snapshots/,
                                 index/, packs/, lock (held by that rank's trainee)

A shard snapshot has the id of the global snapshot it was taken for. The global manifest is
committed (by rank 0, through the ordinary atomic write) only after every rank's shard
manifest is: a shard snapshot whose id no global manifest names is an *orphan* (its global
snapshot failed or is still being agreed) and is never restored. Once a global snapshot with a
higher id exists, an orphan can never become part of one (rank 0 commits global snapshots in
order), so retention removes it.

Nothing here knows programs, ranks' processes or the c10d store: ``capture.dist.coordinator`` does that.
"""

from __future__ import annotations

import json
import pathlib
import time

from gpusnap import atomic
from gpusnap.errors import RunDirError, SnapshotNotFound, StoreError
from gpusnap.store.check import Finding, Leftover
from gpusnap.store.check import leftovers as _leftovers
from gpusnap.store.info import FORMAT_VERSION, SnapshotInfo, is_snapshot_id, utc_now
from gpusnap.store.rundir import RunDir

RANKS = "ranks"


def is_sharded(rd: RunDir) -> bool:
    return bool(rd.identity.get("dist"))


def shard_path(rd: RunDir, rank: int) -> pathlib.Path:
    return pathlib.Path(rd.path) / RANKS / str(int(rank))


def shard_ranks(rd: RunDir) -> list[int]:
    """Ranks that have a shard directory, in order."""
    try:
        names = rd.backend.list(RANKS)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def open_shard(rd: RunDir, rank: int, *, create: bool = False, trusted: bool = False) -> RunDir:
    path = shard_path(rd, rank)
    if create:
        atomic.make_dir(path.parent)
        identity = {**rd.identity, "rank": int(rank)}
        identity.pop("dist", None)
        return RunDir.create(path, identity)
    return RunDir.open(path, trusted=trusted)


def create_top(path, identity: dict, wait_s: float = 10.0) -> RunDir:
    """``RunDir.create`` for the top of a sharded directory, which the supervisors of several
    nodes may create at once on a shared file system: one of them wins, the others open it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return RunDir.create(path, identity)
        except RunDirError as exc:
            # Another node's supervisor is between its first mkdir and its run.json.
            if "non-empty directory" not in exc.message or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def shards_of(manifest: dict) -> dict[int, str]:
    """rank -> shard snapshot id, from a global manifest; StoreError when its table is damaged
    (a rank that is no number, an id that is no snapshot id)."""
    table = manifest.get("shards") or {}
    try:
        named = {int(r): s["snapshot"] for r, s in table.items()}
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"global snapshot {manifest.get('id')}: its shards table is damaged ({exc!r})") from None
    bad = sorted(r for r, s in named.items() if not is_snapshot_id(s) or r < 0)
    if bad:
        raise StoreError(f"global snapshot {manifest.get('id')}: rank {bad[0]}'s shard {named[bad[0]]!r} is no snapshot id")
    return named


def commit_global(rd: RunDir, snap_id: str, world_size: int, shards: dict[int, dict], fields: dict) -> SnapshotInfo:
    """Write global manifest ``snap_id`` once every rank's shard snapshot is committed.
    ``shards[rank]`` is that rank's writer report (``snapshot``, ``stall_s``, ``write_s``,
    ``durable_s``, ``bytes_written``, ``bytes_total``)."""
    rd.checked_id(snap_id)
    if sorted(shards) != list(range(world_size)):
        raise StoreError(f"global snapshot {snap_id} needs {world_size} shards, got ranks {sorted(shards)}")
    for rank, shard in shards.items():
        try:
            open_shard(rd, rank).load_manifest(shard["snapshot"])
        except (RunDirError, StoreError) as exc:
            raise StoreError(f"global snapshot {snap_id}: the shard of rank {rank} is not committed ({exc.message})") from exc
    path = pathlib.Path(rd.path) / "snapshots" / f"{snap_id}.json"
    doc = {
        **fields,
        "format": FORMAT_VERSION,
        "kind": "global",
        "id": snap_id,
        "created": utc_now(),
        "world_size": world_size,
        "stall_s": max(float(s.get("stall_s") or 0.0) for s in shards.values()),
        "write_s": max(float(s.get("write_s") or 0.0) for s in shards.values()),
        # the slowest shard's; the global manifest follows it within the ranks' exchange
        "durable_s": max(float(s.get("durable_s") or 0.0) for s in shards.values()),
        "stats": {
            "bytes_written": sum(int(s.get("bytes_written") or 0) for s in shards.values()),
            "bytes_total": sum(int(s.get("bytes_total") or 0) for s in shards.values()),
        },
        "shards": {str(r): {k: s.get(k) for k in ("snapshot", "stall_s", "write_s", "durable_s", "bytes_written", "bytes_total")}
                   for r, s in sorted(shards.items())},
        "buffers": {},
    }
    try:
        atomic.write_file(path, [json.dumps(doc, indent=1, allow_nan=False).encode()], noreplace=True)
    except atomic.FileExists:
        raise StoreError(f"snapshot {snap_id} already exists in {rd.path}; committed snapshots are never rewritten") from None
    return SnapshotInfo.from_manifest(doc)


def verify(rd: RunDir, snap_id: str | None = None) -> list[Finding]:
    """Every chunk of every shard of one global snapshot (or of all), plus the global manifests
    themselves: a shard they name that is missing is damage."""
    ids = rd.snapshot_ids()
    if snap_id is not None:
        if snap_id not in ids:
            raise SnapshotNotFound(f"no snapshot {snap_id} in {rd.path}")
        ids = [snap_id]
    findings: list[Finding] = []
    checked: dict[tuple[int, str], list[Finding]] = {}
    shards_dirs: dict[int, RunDir | None] = {}
    for sid in ids:
        try:
            m = rd.load_manifest(sid)
            named = shards_of(m)
            world = m.get("world_size")
            if not isinstance(world, int) or isinstance(world, bool) or world < 1:
                raise StoreError(f"global snapshot {sid}: its world_size {world!r} is no number of ranks")
        except StoreError as exc:
            findings.append(Finding("manifest_damaged", sid, None, None, None, exc.message))
            continue
        absent = sorted(set(range(world)) - set(named))
        if absent:
            findings.append(Finding("shard_missing", sid, None, None, None,
                                    f"the manifest names no shard for rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))}"))
        for rank, shard_id in sorted(named.items()):
            if rank not in shards_dirs:
                try:
                    shards_dirs[rank] = open_shard(rd, rank)
                except RunDirError:
                    shards_dirs[rank] = None
            shard = shards_dirs[rank]
            if shard is None or shard_id not in shard.snapshot_ids():
                findings.append(Finding("shard_missing", sid, None, None, None,
                                        f"rank {rank}: shard snapshot {shard_id} is gone"))
                continue
            key = (rank, shard_id)
            if key not in checked:
                checked[key] = shard.verify(shard_id)
            for f in checked[key]:
                findings.append(Finding(f.kind, sid, f.chunk, f.pack, f.path, f"rank {rank}: {f.message}", f.buffer))
    return findings


def newest_intact(rd: RunDir):
    """(newest global snapshot whose every shard verifies, [(id, why) for each newer one])."""
    skipped: list[tuple[str, str]] = []
    for sid in reversed(rd.snapshot_ids()):
        found = verify(rd, sid)
        if not found:
            return SnapshotInfo.from_manifest(rd.load_manifest(sid)), skipped
        more = f" (and {len(found) - 1} more problems)" if len(found) > 1 else ""
        skipped.append((sid, f"{found[0].kind}: {found[0].message}{more}"))
    return None, skipped


def orphans(rd: RunDir, shard: RunDir) -> list[str]:
    """Shard snapshots that no global manifest names and that never will (older than the
    newest global snapshot: a newer one may belong to a global snapshot still being committed)."""
    committed = set(rd.snapshot_ids())
    newest = max(map(int, committed)) if committed else None
    return [s for s in shard.snapshot_ids() if s not in committed and newest is not None and int(s) < newest]


def prune_shard(rd: RunDir, shard: RunDir) -> dict | None:
    """Remove the shard snapshots that no remaining global manifest names (retention of the
    global ones, and orphans), then the chunks nothing references. None when nothing to do."""
    drop = orphans(rd, shard)
    return shard.prune(None, drop=drop) if drop else None


def prune(rd: RunDir, keep: int | None) -> dict:
    """gc of a sharded directory: retention of the global manifests, then each shard's."""
    report = rd.prune(keep)
    totals = {k: report[k] for k in ("removed_packs", "removed_bytes", "removed_temp", "reindexed_chunks")}
    report["shards"] = {}
    for rank in shard_ranks(rd):
        shard = open_shard(rd, rank)
        sub = shard.prune(None, drop=orphans(rd, shard))
        report["shards"][str(rank)] = sub["removed_snapshots"]
        for k in totals:
            totals[k] += sub[k]
        report["kept_unknown"] += [{**u, "path": f"{RANKS}/{rank}/{u['path']}"} for u in sub["kept_unknown"]]
        report["no_room"] = report["no_room"] or sub["no_room"]
    report.update(totals)
    return report


def lock_all(rd: RunDir, purpose: str) -> list:
    """The lock of the top directory and of every shard (each held by its rank's trainee while
    a run goes on), or RunDirLocked naming the first holder."""
    locks = [rd.lock(purpose)]
    try:
        for rank in shard_ranks(rd):
            locks.append(open_shard(rd, rank).lock(purpose))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def leftovers(rd: RunDir) -> list[Leftover]:
    """Temp files anywhere in the tree, each shard's packs no index names, and orphan shard
    snapshots (their global snapshot failed): what gc removes."""
    out = [x for x in _leftovers(rd)]
    for rank in shard_ranks(rd):
        shard = open_shard(rd, rank)
        prefix = f"{RANKS}/{rank}/"
        out += [Leftover(x.kind, prefix + x.path) for x in _leftovers(shard) if x.kind != "temp_file"]
        out += [Leftover("orphan_shard", f"{prefix}snapshots/{sid}.json") for sid in orphans(rd, shard)]
    return out
