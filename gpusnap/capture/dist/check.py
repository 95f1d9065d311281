"""What a rank reads from the job's c10d store, checked before it is used (``capture.dist.coordinator``).

The store is shared with the job (its rendezvous, other libraries), and one left over from
another run may sit at the same address, so nothing read from it is believed unchecked: a value
larger than ``MAX_VALUE_BYTES`` or not JSON is no value; a snapshot id must be one
(``store.info.is_snapshot_id``) before it names a file; a shard a rank reports committed must be
the plan's snapshot, committed on disk at the iteration it reports; and a global snapshot
reported committed must be on disk, naming this rank's shard. Each check returns why a value is
refused, or None; the caller then waits for a value that passes (a rank that writes the key
replaces what was there) until its timeout. The keys themselves carry this run's nonce
(``key_prefix``), so that a store another run left behind does not even name them.
"""

from __future__ import annotations

import json

import xxhash

from gpusnap.store.info import is_snapshot_id

MAX_VALUE_BYTES = 1 << 20
_REASONS = ("signal", "timer", "term", "request", "program", "notice", "peer")


def key_prefix(run_nonce: str, run_id: str, restart_count: str) -> str:
    """``gpusnap/<nonce>/<restart count>/``: the nonce from the run directory's (shared by every
    node) and torchrun's run id (shared by every rank of one launch)."""
    return f"gpusnap/{xxhash.xxh3_64_hexdigest(f'{run_nonce}:{run_id}'.encode())}/{restart_count}/"


def parse(raw: bytes):
    """A value as the store holds it: JSON of at most MAX_VALUE_BYTES, else ValueError."""
    if len(raw) > MAX_VALUE_BYTES:
        raise ValueError(f"a value of {len(raw)} bytes")
    try:
        return json.loads(raw)
    except RecursionError:  # "[[[[...": nested deeper than the decoder goes
        raise ValueError("nested too deep") from None


def _count(value, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _duration(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < 1e9


def post(value) -> str | None:
    """A rank's position (``pos/g/<rank>``)."""
    if not isinstance(value, dict) or not _count(value.get("steps")):
        return f"no position: {value!r:.120}"
    path = value.get("path")
    if not isinstance(path, list) or not all(isinstance(e, list) and len(e) == 4 and all(isinstance(x, str) for x in e[:3])
                                             and _count(e[3]) for e in path):
        return f"a position whose loop path is damaged: {path!r:.120}"
    if not isinstance(value.get("stop"), bool) or value.get("reason") not in _REASONS:
        return "a position without a stop flag and a reason"
    pace = value.get("step_s")
    if pace is not None and not _duration(pace):
        return f"a position whose seconds per step {pace!r:.40} are no duration"
    paces = value.get("paces", [None] * len(path))
    if not isinstance(paces, list) or len(paces) != len(path) or not all(p is None or _duration(p) for p in paces):
        return f"a position whose seconds per iteration of its loops {paces!r:.60} are damaged"
    lengths = value.get("lengths", [None] * len(path))
    if not isinstance(lengths, list) or len(lengths) != len(path) or not all(n is None or _count(n) for n in lengths):
        return f"a position whose loop lengths {lengths!r:.60} are damaged"
    if not is_snapshot_id(value.get("next")):
        return f"a position whose next id {value.get('next')!r:.40} is no snapshot id"
    return None


def plan(value) -> str | None:
    """Rank 0's plan (``plan/g``): the global snapshot's id, where to take it, stop, reason."""
    if not isinstance(value, dict):
        return f"no plan: {value!r:.120}"
    if not is_snapshot_id(value.get("id")):
        return f"a plan whose snapshot id {value.get('id')!r:.40} is no snapshot id"
    at = value.get("at")
    if not isinstance(at, dict) or not _count(at.get("steps")):
        return f"a plan whose target is damaged: {at!r:.120}"
    if "loops" in at and not (isinstance(at["loops"], list) and isinstance(at.get("index"), list)
                              and all(_count(i) for i in at["index"])):
        return "a plan whose target loops are damaged"
    if not isinstance(value.get("stop"), bool) or value.get("reason") not in _REASONS:
        return "a plan without a stop flag and a reason"
    return None


def _committed(value, agreed: dict, what: str, manifest) -> tuple[str | None, dict | None]:
    """(why an outcome is refused or None, the manifest on disk of the commit it claims, or None
    when it reports a failure)."""
    if not isinstance(value, dict) or value.get("event") not in ("committed", "failed"):
        return f"no {what}: {value!r:.120}", None
    if value["event"] == "failed":
        return (None if isinstance(value.get("message"), str) else "a failure without a message"), None
    if value.get("id") != agreed["id"]:
        return f"a {what} of snapshot {value.get('id')!r:.40}, not of the agreed {agreed['id']}", None
    on_disk = manifest(agreed["id"])
    if on_disk is None:
        return f"a {what} of snapshot {agreed['id']} said to be committed, and it is not", None
    return None, on_disk


def done(value, agreed: dict, shard_manifest) -> str | None:
    """A rank's shard outcome (``done/g/<rank>``) against the plan ``agreed``:
    ``shard_manifest(id)`` is that rank's committed shard manifest, or None when there is none."""
    why, on_disk = _committed(value, agreed, "shard", shard_manifest)
    if on_disk is not None and on_disk.get("iteration") != value.get("iteration"):
        return f"a shard said to be of iteration {value.get('iteration')!r:.20} whose manifest says {on_disk.get('iteration')!r:.20}"
    return why


def outcome(value, agreed: dict, global_manifest, rank: int) -> str | None:
    """Rank 0's word on the global snapshot (``global/g``): ``global_manifest(id)`` is the
    committed global manifest, or None when there is none."""
    why, on_disk = _committed(value, agreed, "global snapshot", global_manifest)
    if on_disk is not None and ((on_disk.get("shards") or {}).get(str(rank)) or {}).get("snapshot") != agreed["id"]:
        return f"global snapshot {agreed['id']} names another shard of rank {rank}"
    return why


# What a rank takes of rank 0's word on the global snapshot: the report, never what to do next
# (whether the run stops is the plan's, which every rank checked before it took its shard).
_OUTCOME_FIELDS = {"event": str, "id": str, "message": str, "warning": str, "hint": str, "iteration": int,
                   "stall_s": float, "write_s": float, "durable_s": float, "bytes_written": int, "bytes_total": int,
                   "ranks": int}


def outcome_fields(value: dict) -> dict:
    """The fields of a checked outcome a rank reports, each of its type."""
    kept = {}
    for key, kind in _OUTCOME_FIELDS.items():
        item = value.get(key)
        if isinstance(item, bool):
            continue
        if isinstance(item, kind) or (kind is float and isinstance(item, int)):
            kept[key] = item
    return kept


def resume(value) -> str | None:
    """A rank's word on the snapshot it resumes from (``resume/<rank>``)."""
    return None if value == "none" or is_snapshot_id(value) else f"no snapshot id: {value!r:.40}"
