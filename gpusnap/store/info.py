"""The leaf of the store: the format version and what a committed snapshot is, with no imports
of the store's other modules (the run directory calls the writer, checker and collector, which
need these)."""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass

FORMAT_VERSION = 1
# What a restart moved aside of the program's files goes into DIR/after-<id>/ (files.rollback):
# the program's, never read by gpusnap, so left out of the checks of what gpusnap reads.
AFTER = "after-"
# What a replay is kept from until its merge, DIR/after-<id>.replay/ (files.preserve): gone after
# it, and no copy of what the killed run left, so never the uploader's to copy to a store.
REPLAY_KEPT = ".replay"
# A snapshot id is its number in decimal, zero-padded to at least this many digits: "000042".
SNAP_DIGITS = 6


def is_snapshot_id(text) -> bool:
    """Whether ``text`` is a snapshot id as this gpusnap writes them: digits only (no path
    characters), at least SNAP_DIGITS of them, padded with zeros to exactly that and no more.
    Ids come from file names, manifests, the command line and the job's c10d store: each is
    checked before it becomes part of a path."""
    return (isinstance(text, str) and len(text) >= SNAP_DIGITS and text.isascii() and text.isdigit()
            and text == snapshot_id(int(text)))


def snapshot_id(number: int) -> str:
    return f"{number:0{SNAP_DIGITS}d}"


def by_number(ids) -> list[str]:
    """Snapshot ids oldest first: in the order of their numbers (000999 < 1000000), not of
    their text."""
    return sorted(ids, key=int)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class SnapshotInfo:
    id: str
    created: str
    iteration: int | None
    stall_s: float | None
    bytes_written: int
    bytes_total: int
    resumed_from: str | None
    dirty_bytes: int | None = None  # device bytes copied off the GPU (None: no device memory)
    # From the safe point to the commit (None: written before it was recorded)
    durable_s: float | None = None
    # The timer when the snapshot was asked for ("auto", its seconds, or None), the interval it
    # kept, and the overhead measured over the run so far (manifest "schedule")
    every: str | float | None = None
    interval_s: float | None = None
    overhead: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_manifest(cls, m: dict) -> "SnapshotInfo":
        """What ``ls`` shows of a manifest. Its informational fields are taken as they are
        only where they have the type they should: a damaged one reads as unknown."""
        stats, device, schedule = (_table(m, key) for key in ("stats", "device", "schedule"))
        return cls(
            id=m["id"],
            created=_typed(m.get("created"), str) or "",
            iteration=_typed(m.get("iteration"), int),
            stall_s=_typed(m.get("stall_s"), float),
            bytes_written=_typed(stats.get("bytes_written"), int) or 0,
            bytes_total=_typed(stats.get("bytes_total"), int) or 0,
            resumed_from=_typed(m.get("resumed_from"), str),
            dirty_bytes=_typed(device.get("dirty_bytes"), int),
            durable_s=_typed(m.get("durable_s"), float),
            every=_typed(schedule.get("every"), (str, float)),
            interval_s=_typed(schedule.get("interval_s"), float),
            overhead=_typed(schedule.get("overhead"), float),
        )


def _table(m: dict, key: str) -> dict:
    value = m.get(key)
    return value if isinstance(value, dict) else {}


def _typed(value, kind):
    """``value`` when it is of ``kind`` (a float may be given as an int), else None."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return None
    if float in kinds and isinstance(value, int):
        return float(value)
    return value if isinstance(value, kinds) else None
