"""Tunables, in one place.

Every knob is a module-level value read once at import from ``GPUSNAP_<NAME>`` in the
environment, falling back to the default written here. The supervisor passes its environment to
the trainee, so ``GPUSNAP_CHUNK_BYTES=1048576 gpusnap run train.py`` reaches the writer too.
Sizes are bytes, times are seconds, fractions are 0..1. Tests override knobs through the
environment of the subprocess they start, never by assigning here.
"""

from __future__ import annotations

import os

# One line per environment value that could not be used (its default is used instead);
# `gpusnap run` and `gpusnap restart` refuse to start while any is listed.
PROBLEMS: list[str] = []


def _parsed(name: str, default, parse, expected: str):
    raw = os.environ.get(f"GPUSNAP_{name}")
    if raw is None:
        return default
    try:
        return parse(raw)
    except ValueError:
        PROBLEMS.append(f"GPUSNAP_{name}={raw!r} is not {expected}")
        return default


def _int(name: str, default: int) -> int:
    return _parsed(name, default, int, "an integer")


def _float(name: str, default: float) -> float:
    return _parsed(name, default, float, "a number")


def _non_negative(value: float) -> float:
    if not value >= 0:  # also refuses nan
        raise ValueError(value)
    return value


def _positive(value: float) -> float:
    if not value > 0:  # also refuses nan
        raise ValueError(value)
    return value


def _fraction(value: float) -> float:
    if not 0 < value <= 0.5:
        raise ValueError(value)
    return value


def _str(name: str, default: str) -> str:
    return os.environ.get(f"GPUSNAP_{name}", default)


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(raw)
        return raw.lower()

    return _parsed(name, default, parse, "one of " + ", ".join(choices))


# Content-defined dedup works on fixed chunks of a buffer; 4 MiB keeps the index small (one
# entry per 4 MiB) while a changed region of a buffer still costs only its own chunks.
CHUNK_BYTES = _int("CHUNK_BYTES", 4 << 20)
# Chunks are appended to pack files of about this size, never one file per chunk.
PACK_BYTES = _int("PACK_BYTES", 64 << 20)
# Compression that gains less than this fraction is not worth its decode time: store raw.
COMPRESS_MIN_GAIN = _float("COMPRESS_MIN_GAIN", 0.05)
# How chunks are compressed: "auto" (each chunk raw, LZ4 or ZSTD level 1, by what its compression
# saves in disk time against what it costs in CPU time at the measured disk speed:
# gpusnap/store/choose.py), or every chunk "zstd" (better ratio), "lz4" (3x faster, most of the
# ratio) or "none" (raw: no compression CPU at all).
CODEC = _choice("CODEC", "auto", ("auto", "zstd", "lz4", "none"))
# Encoder threads of the writer's pipeline (0 = one per core; a rank of a distributed run on a
# node of N ranks gets its share, cores / N).
WRITER_THREADS = _int("WRITER_THREADS", 0)
# How the writer runs: "idle" (SCHED_IDLE: only on cores the trainee leaves idle, so training
# barely slows; the snapshot takes longer) or a nice value such as "10".
WRITER_PRIORITY = _parsed(
    "WRITER_PRIORITY", "idle", lambda raw: raw if raw == "idle" else str(int(raw)), "idle or a nice value"
)
# Drain (gpusnap/stage/drain.py): the writer first copies every CPU tensor storage of at least
# DRAIN_MIN_BYTES into its region of the staging arena, shared with the trainee, and drops its own
# copy-on-write mapping, so the trainee's next writes to those pages are not copies. "keep": the
# region is allocated ahead (after each optimizer's first step) and its pages stay for the run, so
# drains copy at memcpy speed (costs host memory the size of the drained tensors); "release":
# allocated by each drain, emptied when its writer is done; "off": no drain.
DRAIN = _choice("DRAIN", "keep", ("keep", "release", "off"))
# The staging arena (gpusnap/stage/arena.py) that the drain and device staging share may grow to
# the host's RAM or the job's memory cgroup limit, whichever is less; a size here caps it lower
# (0: no cap of its own). A snapshot whose staging does not fit is skipped (ArenaFull).
ARENA_BYTES = _int("ARENA_BYTES", 0)
DRAIN_MIN_BYTES = _int("DRAIN_MIN_BYTES", 256 << 10)
# Between snapshots, collapse the optimizers' large CPU tensors into huge pages (stage/hugepages.py):
# after a drain, the trainee's next write costs one fault per 2 MiB, not one per 4 KiB. "off"
# leaves the program's pages as the kernel gave them. Needs a drain.
HUGEPAGES = _choice("HUGEPAGES", "on", ("on", "off"))
# Upper bound on chunk bytes the writer holds in memory at once, whatever the state's size.
WRITER_WINDOW_BYTES = _int("WRITER_WINDOW_BYTES", 256 << 20)

# The program's files (gpusnap/files/): the most bytes of file contents one snapshot keeps
# (--files-max overrides it), smallest files first; a larger file is kept by its length only, which
# puts an appended log back but not a removed or rewritten file. A changed file up to
# FILES_STALL_READ_BYTES is read in the stall; a larger one is read by the writer, through a
# descriptor the stall opened (so the stall costs an open, not a read).
FILES_MAX_BYTES = _parsed("FILES_MAX_BYTES", 512 << 20, lambda raw: int(_non_negative(int(raw))), "a number of bytes >= 0")
FILES_STALL_READ_BYTES = _int("FILES_STALL_READ_BYTES", 1 << 20)

# Fast-forward proves a consumed loop source by a digest of the last item it reproduced; items
# holding more data than this are not digested (restart then checks less; see graph/digest.py).
FF_DIGEST_MAX_BYTES = _int("FF_DIGEST_MAX_BYTES", 64 << 20)

# The witness (graph/witness.py): after each snapshot the program records this many iterations of
# its step loop (what each consumed, the RNG states after it, the parameters after the first
# optimizer step), and a restart compares its own against them. 0 turns the witness off.
WITNESS_ITERATIONS = _parsed("WITNESS_ITERATIONS", 3, lambda raw: int(_non_negative(int(raw))), "an integer >= 0")
# A stop snapshot (SIGTERM, a spot notice) trains on while its writer writes, to record its
# witness, for at most this long after the fork (0: stop at once, and restart unverified).
WITNESS_STOP_S = _parsed("WITNESS_STOP_S", 10.0, lambda raw: _non_negative(float(raw)), "a number >= 0")

# A snapshot asked for while futures of the program's executors run (a background save or
# evaluation) waits for them, training on, for half of this, then waits at a boundary for the rest
# (capture/safepoints/inflight.py); one still running goes into the snapshot as it is.
FUTURES_WAIT_S = _parsed("FUTURES_WAIT_S", 30.0, lambda raw: _non_negative(float(raw)), "a number >= 0")

# A writer that makes no progress (spends no CPU time and is not waiting for a core) for this long
# is hung: the trainee kills it and reports the snapshot failed (capture/writer/watchdog.py). 0 (default):
# a minute plus one second per 50 MB of the trainee's memory.
WRITER_TIMEOUT_S = _parsed("WRITER_TIMEOUT_S", 0.0, lambda raw: _non_negative(float(raw)), "a number of seconds >= 0")

# Fork only when the copy-on-write worst case (the trainee's resident set) is at most this
# fraction of the host memory still available; otherwise skip the snapshot with a warning.
HEADROOM_FRACTION = _float("HEADROOM_FRACTION", 0.9)

# How often the supervisor checks its timer and its child (seconds).
SUPERVISOR_TICK_S = _float("SUPERVISOR_TICK_S", 0.2)
# --every auto (gpusnap/launch/schedule.py): the first snapshot comes this long after training
# starts (its cost, which sets the interval, is measured on it), and no two timer snapshots come
# closer than AUTO_MIN_INTERVAL_S, however little they cost: a program that would lose at most
# that much work gains little from more, and each snapshot adds a manifest and an index file.
AUTO_FIRST_S = _parsed("AUTO_FIRST_S", 30.0, lambda raw: _non_negative(float(raw)), "a number of seconds >= 0")
AUTO_MIN_INTERVAL_S = _parsed("AUTO_MIN_INTERVAL_S", 10.0, lambda raw: _non_negative(float(raw)), "a number of seconds >= 0")
# Default --overhead: the share of training time --every auto may spend on snapshots.
AUTO_OVERHEAD = _parsed("AUTO_OVERHEAD", 0.01, lambda raw: _fraction(float(raw)), "a fraction between 0 and 0.5")
# Default --grace: how long a SIGTERM snapshot may take before the trainee is killed.
DEFAULT_GRACE_S = _float("DEFAULT_GRACE_S", 120.0)
# --notices: how often the cloud's metadata service is asked for a spot/preemption notice (AWS
# asks for every 5 s), and the base URL to ask instead of the clouds' own (a test's fake server).
NOTICE_POLL_S = _float("NOTICE_POLL_S", 5.0)
METADATA_URL = _str("METADATA_URL", "")
# How long before a notice's deadline the grace ends (the trainee is killed if still writing).
NOTICE_MARGIN_S = _float("NOTICE_MARGIN_S", 5.0)

# On a terminal, a snapshot's write and a restore's read that run this long show their progress
# on a status line redrawn in place (elsewhere, only whole lines are written).
STATUS_AFTER_S = _parsed("STATUS_AFTER_S", 1.0, lambda raw: _non_negative(float(raw)), "a number of seconds >= 0")

# 1 (--trust-dir): use run directories, and the code cache, that another user owns or that others
# can write to. Restoring a snapshot runs the code it names, so by default gpusnap refuses them.
TRUST_DIR = _int("TRUST_DIR", 0)

# The holder of a run directory's lock refreshes its mtime this often; a lock whose record names
# another host (where flock may not reach: some network file systems) is taken over only after
# it has gone unrefreshed for LOCK_STALE_S, and reported as held before (gpusnap/store/lock.py).
LOCK_REFRESH_S = _parsed("LOCK_REFRESH_S", 10.0, lambda raw: _positive(float(raw)), "a number of seconds > 0")
LOCK_STALE_S = _parsed("LOCK_STALE_S", 60.0, lambda raw: _non_negative(float(raw)), "a number of seconds >= 0")

# Where instrumented code objects are cached, keyed by source hash, transform version and
# Python version. Empty: $XDG_CACHE_HOME/gpusnap (or ~/.cache/gpusnap); "off": no cache.
# Never the user's __pycache__: a later plain `python` run must not load instrumented code.
CACHE_DIR = _str("CACHE_DIR", "")

# The fake GPU (gpusnap/device/fake/), which CI runs device code on: how many devices it has and
# how many bytes each can allocate (address space reserved up front; pages only as written).
FAKE_DEVICES = _int("FAKE_DEVICES", 2)
FAKE_DEVICE_BYTES = _int("FAKE_DEVICE_BYTES", 1 << 30)
# The seed of the order in which the fake GPU runs work that CUDA leaves unordered (streams
# without an event between them, "synchronous" calls still in flight): unset, each process picks
# one at random; the tests print theirs on a failure, and setting it replays that order.
FAKE_SEED = _parsed("FAKE_SEED", None, int, "an integer")
# Where the fake GPU puts device memory: "random" (another base in every process, so that a
# restore that kept an old address fails) or "repeat" (the same bases in every process, as a
# real GPU often gives them: nothing may assume that a restart moved them).
FAKE_BASES = _choice("FAKE_BASES", "random", ("random", "repeat"))
# Which GPU a run uses: "cuda" (cuda-python over the real driver) or "fake" (the fake GPU above,
# installed as cuda.bindings.driver/runtime before the program's imports: CI and tests).
DEVICE = _choice("DEVICE", "cuda", ("cuda", "fake"))
# 1: every snapshot copies every chunk of device memory, fingerprints notwithstanding (--paranoid).
PARANOID = _int("PARANOID", 0)
# Device ranges smaller than this are copied whole at every snapshot, without a fingerprint.
# 0: every range is fingerprinted (a range costs one more row of the one launch per device).
FINGERPRINT_MIN_BYTES = _int("FINGERPRINT_MIN_BYTES", 0)
# Two device->host copies on one device this close together become one copy of both and the
# bytes between: torch's allocator rounds blocks up, so its neighbours rarely touch.
COPY_GAP_BYTES = _int("COPY_GAP_BYTES", 64 << 10)
# Where restored tensors that the replayed program does not hold go when the snapshot's device
# is not there: "SAVED:NEW,..." (e.g. "1:0,2:0"; NEW may be "cpu"); unnamed devices map to the
# same ordinal when it exists, else ordinal modulo the devices there are, else the CPU.
def _device_map(raw: str) -> dict:
    pairs = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        saved, _, new = item.partition(":")
        pairs[int(saved)] = "cpu" if new.strip() == "cpu" else int(new)
    return pairs


DEVICE_MAP = _parsed("DEVICE_MAP", {}, _device_map, 'a list of SAVED:NEW device ordinals, e.g. "1:0,2:cpu"')

# Distributed runs (torchrun; capture/dist/coordinator.py): how long a rank waits for the others at each
# phase of a global snapshot (agreeing on an iteration, reaching it, every shard's commit) and
# for the job's c10d store to answer, before that snapshot is abandoned (training goes on).
DIST_TIMEOUT_S = _parsed("DIST_TIMEOUT_S", 300.0, lambda raw: _positive(float(raw)), "a number of seconds > 0")
# The agreed iteration lies at least this many optimizer steps (or iterations of the safe-point
# loop, for a program without torch.optim) beyond the furthest rank's posted position, and at
# least DIST_LEAD_S of the fastest rank's recent steps: each rank learns the target from a thread
# that talks to the job's store, and with fast steps on a busy machine two steps were over before
# it did (the snapshot then fails for every rank; docs/distributed.md).
DIST_MARGIN = _int("DIST_MARGIN", 2)
DIST_LEAD_S = _parsed("DIST_LEAD_S", 0.5, lambda raw: _non_negative(float(raw)), "a number of seconds >= 0")

# Run directories on an object store (store.objects, store.levels). A snapshot commits in a local
# directory first, under LEVEL_DIR/<scheme>/<bucket>/<prefix> (the local level), and is copied
# to the store in the background. Empty: $XDG_CACHE_HOME/gpusnap/runs (or ~/.cache/gpusnap/runs).
# It is a cache, never needed for correctness: a machine without it restarts from the store.
LEVEL_DIR = _str("LEVEL_DIR", "") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpusnap", "runs")
# Requests in flight at once per store: the parts of a multipart upload, the ranges of a read.
STORE_CONNECTIONS = _int("STORE_CONNECTIONS", 8)
# A part of a multipart upload and a range of a parallel read. S3 needs parts >= 5 MiB.
STORE_PART_BYTES = _int("STORE_PART_BYTES", 8 << 20)
# The uploader looks for newly committed local snapshots this often.
UPLOAD_TICK_S = _float("UPLOAD_TICK_S", 1.0)
# The lock object's lease: a holder refreshes it every third of this; another machine takes a
# lock over once it has gone unrefreshed this long (its holder is gone with its VM).
STORE_LEASE_S = _float("STORE_LEASE_S", 60.0)
# Retries of a throttled or dropped request (store.retry): attempts, and the first backoff.
STORE_RETRIES = _int("STORE_RETRIES", 5)
STORE_BACKOFF_S = _float("STORE_BACKOFF_S", 0.2)
# Set by `gpusnap restart` of a run from an object store whose recorded working directory is not
# on this machine: the paths under it in the snapshot's manifest (loop positions, sources, the
# program's files) are read as under the current working directory (gpusnap.moved).
MOVED_FROM = os.environ.get("GPUSNAP_MOVED_FROM") or None
