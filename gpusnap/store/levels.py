"""Levels: a snapshot commits where it is fastest, then is copied where the next machine finds it.

A run whose directory is a URL (``--dir s3://bucket/run``) writes its snapshots exactly as a
local run does, into a local directory (``cache_dir``: the *local* level), so the trainee's stall
is that of a local run. A thread of the supervisor (``Uploader``) copies each committed snapshot
to the object store (the *shared* level) while training goes on: its new packs (each a parallel
multipart upload), one index file naming them, its witness, then its manifest, last, with a
conditional create: the snapshot exists in the store from that put on, and never half.

The run's file journal (``files.jsonl``: what the program wrote, gpusnap/files) is copied whole
before each snapshot's manifest, so that the marker a snapshot wrote into it is in the store
before the snapshot is, and again whenever it grew; each copy ends with a line
``{"copied": TIME, "closed": BOOL}``, ``closed`` only in the copy made after the run ended, when
it is the whole journal (``files.journal`` reads it). The run log is copied whenever it grew. A
restart's ``after-<id>/`` (the program's files it moved aside) is copied file by file, under the
same keys, once it is there; nothing in the store is ever removed from it.

A restart on a machine without the local directory (``fetch``) takes the newest snapshot that
reached the store, reads its packs with parallel range requests into a new local directory,
copies the store's journal there (replacing a local one, which cannot hold that snapshot's
marker), commits the manifest there last, and restarts from it. The run log of both levels is
merged into the local one first (``merge_logs``), so that the uploader, which copies it whole,
never replaces lines other machines appended with a stale copy. The local directory is a cache:
deleting it loses nothing the store holds once the uploader has copied it.
"""

from __future__ import annotations

import heapq
import json
import mmap
import os
import pathlib
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from gpusnap import knobs
from gpusnap.errors import GpusnapError, StoreError
from gpusnap import atomic
from gpusnap.store import index, witness
from gpusnap.store.backend import Backend
from gpusnap.store.info import AFTER, REPLAY_KEPT, utc_now
from gpusnap.store.local import LocalBackend
from gpusnap.store.pack import pack_key
from gpusnap.store.rundir import RUN_JSON, RunDir

LOCAL, SHARED = "local", "shared"
LOG = "log.jsonl"  # the run log, copied whole whenever it grew (what `gpusnap ls` reads of the run)
JOURNAL = "files.jsonl"  # the file journal (gpusnap/files/journal.py: what its copies end with)


def cache_dir(url: str) -> pathlib.Path:
    """The local level of run directory ``url``: LEVEL_DIR/<scheme>/<bucket>/<prefix>."""
    scheme, _, rest = url.partition("://")
    parts = [p for p in rest.split("/") if p not in ("", ".", "..")]
    return pathlib.Path(knobs.LEVEL_DIR, scheme.lower(), *parts)


def _needed_packs(rd: RunDir, manifest: dict, idx: index.Index) -> dict[str, list]:
    """pack id -> [(chunk id, location)] of every pack holding a chunk of ``manifest``."""
    want = {str(c) for rec in manifest["buffers"].values() for c, _ in rec["chunks"]}
    packs: dict[str, list] = {}
    for cid in want:
        loc = idx.chunks.get(cid)
        if loc is None:
            raise StoreError(f"snapshot {manifest['id']}: chunk {cid} is in no pack of {rd.backend.location}")
        packs.setdefault(loc.pack, [])
    for cid, loc in idx.chunks.items():
        if loc.pack in packs:
            packs[loc.pack].append((cid, loc))
    return packs


def copy_snapshot(src: RunDir, dst: Backend, snap_id: str, have_packs: set[str], report: dict,
                  journal: bytes | None = None) -> bool:
    """Copy snapshot ``snap_id`` of ``src`` to ``dst``: packs ``dst`` lacks, one index file
    naming them, the file journal (``journal``, when given), the witness, the manifest last (a
    conditional create). False when ``dst`` holds that id already (another writer committed it)."""
    raw = src.backend.get(f"snapshots/{snap_id}.json")
    manifest = json.loads(raw)
    manifest["id"] = snap_id
    idx = src._read_index = index.load(src)
    packs = _needed_packs(src, manifest, idx)
    new = {pid: located for pid, located in packs.items() if pid not in have_packs}
    sizes: dict[str, int] = {}

    def one(pid: str) -> None:
        t0 = time.monotonic()
        sizes[pid] = _copy_object(src.backend, dst, pack_key(pid))
        report["seconds"] += time.monotonic() - t0

    # Each pack's own parts or ranges go in parallel too (obstore); a few packs at once keep the
    # connections busy between one pack's last part and the next's first.
    with ThreadPoolExecutor(max(1, min(max(dst.connections, src.backend.connections) // 2, len(new) or 1))) as pool:
        list(pool.map(one, sorted(new)))
    if new:
        index.write(dst, snap_id, {pid: (sizes[pid], located) for pid, located in new.items()},
                    manifest.get("created") or "")
    have_packs.update(new)
    report["bytes"] += sum(sizes.values())
    if journal is not None:  # before the manifest: a snapshot is never without its journal's marker
        dst.put(JOURNAL, [journal])
    try:
        dst.put(witness.key(snap_id), [src.backend.get(witness.key(snap_id))])
    except FileNotFoundError:
        pass
    try:
        dst.commit(f"snapshots/{snap_id}.json", raw)
    except atomic.FileExists:
        return False
    return True


def _copy_object(src: Backend, dst: Backend, key: str) -> int:
    """One object from ``src`` to ``dst``: read in parallel ranges where ``src`` can, then one
    put (a parallel multipart upload on an object store)."""
    if src.connections <= 1:
        data = src.get(key)
    else:
        size, part = src.size(key), max(1, knobs.STORE_PART_BYTES)
        data = b"".join(src.get_ranges(key, [(o, min(part, size - o)) for o in range(0, size, part)]))
    return dst.put(key, [data], direct=True)


def ensure_run(shared: Backend, local: RunDir) -> None:
    try:
        shared.commit(RUN_JSON, local.backend.get(RUN_JSON))
    except atomic.FileExists:
        pass


class Uploader:
    """Copies each snapshot committed in ``local`` to ``shared``, oldest first, in a thread of
    the supervisor. ``keep``: the store keeps that many (retention, as --keep locally)."""

    def __init__(self, local: RunDir, shared: Backend, keep: int | None = None, say=None) -> None:
        self.local, self.shared, self.keep = local, shared, keep
        self._say = say or (lambda line: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.report = {"snapshots": [], "bytes": 0, "seconds": 0.0, "failures": 0}
        self._have: set[str] | None = None
        self._failed_once: set[str] = set()
        self._sent: dict[str, object] = {}  # key -> what of it the store holds: a log's length, a file's stat

    def start(self) -> "Uploader":
        ensure_run(self.shared, self.local)
        self._thread = threading.Thread(target=self._loop, name="gpusnap-uploader", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(knobs.UPLOAD_TICK_S):
            self.sync()

    def sync(self, closed: bool = False) -> list[str]:
        """Copy what is committed locally and not yet in the store; the ids it copied. A failure
        leaves the store as it was before the snapshot's manifest (nothing half-committed is
        visible) and is tried again at the next tick. ``closed``: the run has ended, and the
        journal copied now is the whole of it."""
        from gpusnap.store.pack import list_packs

        done = []
        try:
            shared_ids = set(_ids(self.shared))
            if self._have is None:
                self._have = {pid for pid, _ in list_packs(self.shared)}
            for sid in self.local.snapshot_ids():
                if sid in shared_ids or sid in self.report["snapshots"]:
                    continue
                journal, length = self._journal(closed)
                if copy_snapshot(self.local, self.shared, sid, self._have, self.report, journal):
                    self.report["snapshots"].append(sid)
                    done.append(sid)
                    self._say(f"snapshot {sid} reached {self.shared.location}")
                if journal is not None:
                    self._sent[JOURNAL] = (length, closed)
            journal, length = self._journal(closed)
            if journal is not None and self._sent.get(JOURNAL) != (length, closed):
                self.shared.put(JOURNAL, [journal])
                self._sent[JOURNAL] = (length, closed)
            try:
                log = self.local.backend.get(LOG)
                if self._sent.get(LOG) != len(log):
                    self.shared.put(LOG, [log])
                    self._sent[LOG] = len(log)
            except FileNotFoundError:
                pass
            if done and self.keep is not None:
                from gpusnap.store.gc import prune

                prune(RunDir.open(self.shared.location, backend=self.shared), self.keep)
                self._have = None
            self._copy_after()
        except (GpusnapError, OSError, ValueError) as exc:
            self.report["failures"] += 1
            message = getattr(exc, "message", None) or str(exc)
            if message not in self._failed_once:  # once per kind of failure, not every tick
                self._failed_once.add(message)
                self._say(f"copying to {self.shared.location} failed ({message}); retrying; training goes on")
        return done

    def _journal(self, closed: bool) -> tuple[bytes | None, int]:
        """The copy of the local journal to put, its whole lines then the line that ends a copy
        (files.journal), and the length of the lines; (None, 0) without a journal."""
        try:
            data = self.local.backend.get(JOURNAL)
        except FileNotFoundError:
            return None, 0
        data = data[: data.rfind(b"\n") + 1]  # a line written right now is the next copy's
        end = json.dumps({"copied": utc_now(), "closed": closed}, separators=(",", ":")).encode() + b"\n"
        return data + end, len(data)

    def _copy_after(self) -> None:
        """Every file under the local level's ``after-<id>/`` that the store lacks, under the same
        key (links and empty directories stay local: an object store has neither). A file is
        put from a read-only map of it, so a later checkpoint of many GB takes no memory of the
        supervisor's own."""
        try:
            names = [n for n in self.local.backend.list("") if n.startswith(AFTER) and not n.endswith(REPLAY_KEPT)]
        except FileNotFoundError:
            return
        root = pathlib.Path(self.local.path)
        for name in sorted(names):
            if name not in self._sent:  # first seen by this uploader: what an earlier one copied
                self._sent[name] = True
                for key in self.shared.list_tree(name):
                    self._sent[f"{name}/{key}"] = None
            for folder, _, files in os.walk(root / name):
                for file in sorted(files):
                    path = pathlib.Path(folder, file)
                    key = str(path.relative_to(root))
                    try:
                        st = os.lstat(path)
                    except FileNotFoundError:
                        continue
                    if not stat.S_ISREG(st.st_mode) or (key in self._sent and self._sent[key] in (None, _stat_key(st))):
                        continue
                    try:
                        with _mapped(path) as view:
                            self.shared.put(key, [view], direct=True)
                    except PermissionError as exc:  # the program's own file, unreadable to it: left local, said once
                        self._say(f"{path} stays in {self.local.path} only: {exc.strerror}")
                    self._sent[key] = _stat_key(st)

    def summary(self) -> str | None:
        """One line on what reached the store, when anything was to be copied."""
        r = self.report
        mib = r["bytes"] / 2**20
        rate = f" ({mib / r['seconds']:.1f} MiB/s)" if r["seconds"] > 0 else ""
        counts = getattr(self.shared, "counts", {})
        retried = f"; retried {counts.get('throttled', 0)} throttled and {counts.get('dropped', 0)} dropped requests" \
            if counts.get("throttled") or counts.get("dropped") else ""
        left = [sid for sid in self.local.snapshot_ids() if sid not in r["snapshots"] and sid not in _ids(self.shared)]
        missing = f"; not in the store: {', '.join(left)} (they stay in {self.local.path})" if left else ""
        if not r["snapshots"] and not left:
            return None
        return f"{len(r['snapshots'])} snapshots copied to {self.shared.location}: {mib:.1f} MiB of packs{rate}{retried}{missing}"

    def stop(self) -> None:
        """Stop the thread, then copy what is left (the stop snapshot of a preempted run), and
        the journal as closed: the run has ended, its trainee is gone."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync(closed=True)


def _stat_key(st) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class _mapped:
    """A read-only memoryview of a local file (empty bytes for an empty one)."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._map = None
        self._view = None

    def __enter__(self):
        with open(self._path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._map)
        return self._view

    def __exit__(self, *exc) -> None:
        try:
            if self._view is not None:
                self._view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass  # a failed put's traceback still holds a view: the map goes when it does


def _ids(b: Backend) -> list[str]:
    from gpusnap.store.info import by_number, is_snapshot_id

    try:
        names = b.list("snapshots")
    except FileNotFoundError:
        return []
    return by_number(n[:-5] for n in names if n.endswith(".json") and is_snapshot_id(n[:-5]))


def levels(local: RunDir | None, shared: RunDir) -> dict[str, str]:
    """snapshot id -> "local", "shared" or "local+shared"."""
    out = {sid: SHARED for sid in shared.snapshot_ids()}
    for sid in local.snapshot_ids() if local is not None else ():
        out[sid] = f"{LOCAL}+{SHARED}" if sid in out else LOCAL
    return out


def fetch(shared: RunDir, path: pathlib.Path, say=None) -> RunDir:
    """The local level of ``shared`` at ``path``, holding the newest snapshot of the store that
    reads (its manifest, every chunk indexed), made from the store's when the local directory
    lacks it; a local directory with a newer committed snapshot (this machine took it) is kept."""
    say = say or (lambda line: None)
    raw = shared.backend.get(RUN_JSON)
    if not (path / RUN_JSON).exists():
        missing = [p for p in [path, *path.parents] if not p.exists()]
        for p in reversed(missing):
            atomic.make_dir(p)
            os.chmod(p, 0o700)
        local = LocalBackend(path)
        for sub in ("snapshots", "index", "packs"):
            atomic.make_dir(path / sub)
        local.commit(RUN_JSON, raw)
    rd = RunDir.open(path)
    if json.loads(raw).get("nonce") != rd.nonce:
        raise StoreError(f"{path} caches another run than {shared.backend.location}",
                         hint=f"remove {path} (a cache: the store keeps everything) and restart again")
    _take_log(rd, shared)
    local_ids = rd.snapshot_ids()
    for sid in reversed(shared.snapshot_ids()):
        if local_ids and int(local_ids[-1]) >= int(sid):
            return rd
        t0 = time.monotonic()
        report = {"bytes": 0, "seconds": 0.0}
        try:
            journal = shared.backend.get(JOURNAL)  # as the store has it: its last line says whether it is whole
        except FileNotFoundError:
            journal = None
        try:
            copy_snapshot(shared, rd.backend, sid, {pid for pid, _ in _local_packs(rd)}, report, journal)
        except (StoreError, ValueError, KeyError) as exc:
            say(f"skipping snapshot {sid} of {shared.backend.location}: {getattr(exc, 'message', exc)}")
            continue
        dt = max(time.monotonic() - t0, 1e-9)
        say(f"fetched snapshot {sid} from {shared.backend.location}: {report['bytes'] / 2**20:.1f} MiB in "
            f"{dt:.2f} s ({report['bytes'] / 2**20 / dt:.1f} MiB/s)")
        return rd
    return rd


def _take_log(rd: RunDir, shared: RunDir) -> None:
    """Before a restart here: the run log of both levels in the local one. The store's holds what
    other machines appended since this one last ran (the uploader copies the local log whole,
    so a stale local log would have replaced those lines in the store), the local one what this
    machine appended and may not have sent."""
    try:
        theirs = shared.backend.get(LOG)
    except FileNotFoundError:
        return
    try:
        ours = rd.backend.get(LOG)
    except FileNotFoundError:
        ours = b""
    both = merge_logs(ours, theirs)
    if both != ours:
        rd.backend.put(LOG, [both])


def merge_logs(ours: bytes, theirs: bytes) -> bytes:
    """Every whole line of two copies of one run log, each copy's in its own order, the two
    interleaved by their times (``t``); a line both hold, once. A line cut short (a copy made
    while it was written) is left out."""
    if theirs.startswith(ours):
        return _whole_lines(theirs)
    if ours.startswith(theirs):
        return _whole_lines(ours)
    mine = _whole_lines(ours).splitlines(keepends=True)
    known = set(mine)
    other = [line for line in _whole_lines(theirs).splitlines(keepends=True) if line not in known]
    return b"".join(heapq.merge(mine, other, key=_time_of))


def _whole_lines(data: bytes) -> bytes:
    return data[: data.rfind(b"\n") + 1]


def _time_of(line: bytes) -> float:
    try:
        return float(json.loads(line).get("t", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0


def _local_packs(rd: RunDir):
    from gpusnap.store.pack import list_packs

    return list_packs(rd)
