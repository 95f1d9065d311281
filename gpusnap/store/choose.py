"""Which encoding each chunk gets: raw, LZ4 or ZSTD, by what it saves against what it costs.

A chunk is compressed only when the disk time its smaller size saves is more than the CPU time
its compression takes, spread over the writer's encoder threads::

    compress with codec c  iff  (1 - ratio_c) / disk_bps  >  1 / (speed_c * threads)

where ``ratio_c`` is stored/raw bytes and ``speed_c`` one thread's bytes per second of wall
time (at idle priority on a busy host that includes the time it waits for a core, so a writer
that gets little CPU compresses less, on its own). Of the codecs that pay, the one that saves
the most wins. On a fast disk, float weights that compress by 15% are written raw; a chunk of
zeros is compressed at almost any disk speed (LZ4 does that at several GB/s).

Each chunk's ratio under LZ4 comes from a probe: its middle ``PROBE_BYTES`` compressed with LZ4
(~1-2% of the chunk's cost); ZSTD's ratio is the probe's scaled by what this writer saw of ZSTD
against its probes on the same kind of data (floats, integers, bytes), starting from the
measurements below. Speeds are learned from the writer's own compressions, per byte of
incompressible data: data that compresses well compresses faster (``_faster``), by up to 8x.
The disk's speed is measured by the writer's own pack writes (``wrote``), starting from what
the run's last snapshot measured (its manifest's ``stats.disk_bps``), or ``DISK_BPS_GUESS``.

Measured with tools/bench_codec.py on Adam training states (tools/results/bench_codec-*.txt):
bytedelta and bitshuffle never beat shuffle under ZSTD on weights or moments, so each kind of
data has one filter per codec (``codec.params_for``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gpusnap.store import codec

PROBE_BYTES = 64 << 10
# Before the writer's first pack is written and no earlier snapshot measured the disk: a local
# NVMe or a page cache, where compressing floats does not pay.
DISK_BPS_GUESS = 1.0e9
# One thread's bytes per second on incompressible floats (2-core CI machine, 4 MiB chunks).
_SPEED_GUESS = {"lz4": 0.6e9, "zstd": 0.25e9}
# ZSTD's stored bytes against the LZ4 probe's of the same chunk, per kind of data.
_ZSTD_VS_PROBE = {"float": 0.95, "int": 0.9, "bytes": 0.85}
_EWMA = 0.2  # weight of each new measurement


def _faster(ratio: float) -> float:
    """How much faster than on incompressible data a codec runs on data that compresses to
    ``ratio`` (fewer matches to encode, less to write; the filters cost the same)."""
    return min(8.0, 1.0 / max(ratio, 1e-3))


def kind_of(dtype: str, typesize: int) -> str:
    if typesize <= 1 or dtype in ("bytes", "bool", "uint8", "int8"):
        return "bytes"
    return "float" if dtype.startswith(codec.FLOATS) else "int"


class Chooser:
    """Shared by the writer's encoder threads: ``pick`` for each new chunk, ``encoded`` after
    each compression, ``wrote`` after each pack write. ``forced``: "zstd" or "lz4" compresses
    every chunk with that codec (raw when it gains less than COMPRESS_MIN_GAIN), "none" stores
    every chunk raw, None chooses."""

    def __init__(self, threads: int, disk_bps: float | None = None, forced: str | None = None):
        self.threads = max(1, threads)
        self.disk_bps = disk_bps if disk_bps and disk_bps > 0 else DISK_BPS_GUESS
        self.measured_disk = False
        self.forced = forced
        self.speed = dict(_SPEED_GUESS)  # one thread's bytes/s, per codec
        self.vs_probe = dict(_ZSTD_VS_PROBE)
        self.counts = {"raw": 0, "lz4": 0, "zstd": 0}
        self._lock = threading.Lock()

    def pick(self, data, dtype: str, typesize: int) -> Choice | None:
        """How to compress ``data``, or None: store it raw."""
        if self.forced is not None:
            return None if self.forced == "none" else Choice(self.forced, None)
        d, k = self.disk_bps, self.threads
        # Even a chunk that compresses to nothing saves only 1 / d per byte: when LZ4 at its
        # fastest costs more, no probe can change the answer.
        if not len(data) or d >= _faster(0.0) * self.speed["lz4"] * k:
            return None
        kind = kind_of(dtype, typesize)
        ratio = probe(data, dtype, typesize)
        best, gain = None, 0.0
        for name, r in (("lz4", ratio), ("zstd", ratio * self.vs_probe[kind])):
            g = (1.0 - r) / d - 1.0 / (self.speed[name] * _faster(r) * k)
            if g > gain:
                best, gain = name, g
        return Choice(best, (kind, ratio)) if best else None

    def encoded(self, choice: Choice, raw_nbytes: int, stored_nbytes: int, seconds: float) -> None:
        """``choice`` compressed ``raw_nbytes`` into ``stored_nbytes`` in ``seconds``."""
        if seconds <= 0 or not raw_nbytes:
            return
        ratio = stored_nbytes / raw_nbytes
        speed = raw_nbytes / seconds / _faster(ratio)
        with self._lock:
            self.speed[choice.codec] += _EWMA * (speed - self.speed[choice.codec])
            if choice.codec == "zstd" and choice.probe is not None:
                kind, probed = choice.probe
                self.vs_probe[kind] += _EWMA * (ratio / max(probed, 1e-6) - self.vs_probe[kind])

    def stored(self, codec_name: str | None) -> None:
        with self._lock:
            self.counts[codec_name or "raw"] += 1

    def wrote(self, nbytes: int, seconds: float) -> None:
        """A pack of ``nbytes`` was written (and fsynced) in ``seconds``."""
        if seconds <= 0 or nbytes < (1 << 20):
            return  # a small pack's time is mostly its fsyncs, not the disk's bandwidth
        with self._lock:
            bps = nbytes / seconds
            self.disk_bps = bps if not self.measured_disk else self.disk_bps + _EWMA * (bps - self.disk_bps)
            self.measured_disk = True


@dataclass(frozen=True)
class Choice:
    codec: str  # "lz4" or "zstd"
    probe: tuple | None  # (kind of data, the LZ4 probe's stored/raw); None when forced


def probe(data, dtype: str, typesize: int) -> float:
    """Stored/raw bytes of LZ4 on the chunk's middle PROBE_BYTES."""
    n = len(data)
    if n > PROBE_BYTES:
        start = (n // 2 - PROBE_BYTES // 2) // 64 * 64
        data = data[start : start + PROBE_BYTES]
    return len(codec.compress(data, dtype, typesize, "lz4")) / len(data)
