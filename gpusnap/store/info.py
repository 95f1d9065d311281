"""The leaf of the store: the format version and what a committed snapshot is, with no imports
of the store's other modules (the run directory calls the writer, checker and collector, which
need these)."""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass

FORMAT_VERSION = 1


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
        stats = m.get("stats") or {}
        return cls(
            id=m["id"],
            created=m.get("created", ""),
            iteration=m.get("iteration"),
            stall_s=m.get("stall_s"),
            bytes_written=int(stats.get("bytes_written", 0)),
            bytes_total=int(stats.get("bytes_total", 0)),
            resumed_from=m.get("resumed_from"),
            dirty_bytes=(m.get("device") or {}).get("dirty_bytes"),
            durable_s=m.get("durable_s"),
            every=(m.get("schedule") or {}).get("every"),
            interval_s=(m.get("schedule") or {}).get("interval_s"),
            overhead=(m.get("schedule") or {}).get("overhead"),
        )
