"""Putting the program's files back as they were at a snapshot, twice in a restart.

``rollback`` (the supervisor, before the replay starts): every file in the snapshot's table, every
path the killed run's journal names after the snapshot's marker, and every entry of a directory
the program made goes back to its state at the snapshot. Nothing is deleted: a file or directory
that was not there then moves into ``DIR/after-<id>/`` (its absolute path below it), as does a
changed file before its snapshot content is written back; an appended file is copied there before
it is cut back to its length. A file whose state cannot be put back (removed or rewritten after the
snapshot and too large to have been kept; a file the program first changed after it) stops the
restart before anything moves (``FilesNotRestorable``, exit 6), unless ``--force``: then it stays as
it is, and the log says so. So does a journal cut short (``journal``: a store's copy of a run whose
machine was lost) when the run's files outlived that machine.

``settle`` (the trainee, at the merge): the replay ran the program's setup again, and what that
wrote (a log line, a logger's next version directory, a checkpoint directory made again) is undone
the same way, in place: the program may hold those files open, so contents are written into the
same inode and the program's own descriptors are moved to the new end; a path the replay made is
moved aside unless the program holds it open (a TensorBoard event file it goes on writing).

The plan is made first (``Plan``: what to do with each path, what cannot be done), then carried out
(``Plan.apply``); ``Plan.report()`` is the ``files`` event: what moved where, what was written, cut
or left, for the run log.

A single-process run's files are put back on whatever host restarts it (the next machine needs
them, where the program will look for them). A distributed rank's are put back by the node that
runs that rank in the restarted job, whatever its name, where torchrun's options fix the ranks a
node runs before its rendezvous (a single node; ``--node-rank`` under a static rendezvous); where
the rendezvous assigns them (c10d over several nodes), by the host that recorded them, and a
rank that finds its files recorded on another host refuses (``refused_elsewhere``). A rank's
files recorded on another host whose directory is missing here (a node-local disk of a node
that is gone) cannot be put back: the restart refuses, as for any file it cannot put back.

What this keeps in the run directory goes through its backend (``store.backend``): the journal is
read with ``get`` and a restart's line added with ``append``, and ``after-<id>/`` is named where
neither the local level nor the store (``shared``) holds one. Moving aside is a rename into the
local level (a copy across file systems): the program's files are on a file system, and so is
the local level; the levels' copy takes ``after-<id>/`` to the store. The per-host lock and mark
(``files-<host>.lock``, ``files-<host>.json``) stay files of the local directory: they keep the
supervisors of one host from putting the same files back twice (``flock``), which concerns
only processes of that host, and they name nothing a restart elsewhere needs; a distributed run,
the only one that takes them, never has its directory on an object store.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat as stat_
from dataclasses import dataclass, field

import xxhash

from gpusnap import lifeline
from gpusnap.errors import FilesNotRestorable, GpusnapError
from gpusnap.files import disk, journal, preserve, watch
from gpusnap.files.paths import Excludes, ancestors
from gpusnap.store.info import AFTER


@dataclass
class Source:
    """One snapshot's file table (a rank's, in a distributed run) and how to read its contents."""

    snap_id: str
    table: dict
    buffers: dict
    read_buffer: object  # read_buffer(record) -> bytes
    journal: bytes | None = None  # the journal of the run that took it (``journal.read``)
    elsewhere: str | None = None  # a rank's table recorded on another host: "rank R on HOST"


@dataclass
class Plan:
    after_dir: str  # where what is moved aside goes
    in_place: bool  # settle: write into the files the program may hold open
    moves: list = field(default_factory=list)  # paths to move aside
    makes: list = field(default_factory=list)  # (path, mode) directories to make
    writes: list = field(default_factory=list)  # (path, entry, source) contents to write back
    cuts: list = field(default_factory=list)  # (path, length) files to cut back
    links: list = field(default_factory=list)  # (path, target)
    problems: list = field(default_factory=list)  # (path, why): what cannot be put back, known before
    failed: list = field(default_factory=list)  # (path, why): what apply could not do
    left: list = field(default_factory=list)  # (path, why): not put back, said in the log
    cut: list = field(default_factory=list)  # (source, why, a path here): journals cut short, gone on with
    moved: list = field(default_factory=list)  # (path, to): what apply moved
    copied: list = field(default_factory=list)  # (path, to): what apply copied before cutting it back
    contents: dict = field(default_factory=dict)  # path -> the bytes to write back, read ahead (prefetch)
    open_paths: frozenset = frozenset()
    kept: dict = field(default_factory=dict)  # settle: path -> the copy kept from the replay (``preserve``)
    restores: list = field(default_factory=list)  # (path, that copy): files put back from it

    def report(self) -> dict:
        return {"moved": [list(m) for m in self.moved], "copied": [list(c) for c in self.copied],
                "restored": [w[0] for w in self.writes] + [r[0] for r in self.restores],
                "truncated": [c[0] for c in self.cuts], "made": [m[0] for m in self.makes] + [l[0] for l in self.links],
                "left": [list(x) for x in self.left + self.problems + self.failed + [[p, why] for _, why, p in self.cut if p]],
                **({"cut": [why for _, why, _ in self.cut]} if self.cut else {})}

    def summary(self) -> str | None:
        parts = []
        if self.writes or self.restores:
            parts.append(f"{len(self.writes) + len(self.restores)} restored")
        if self.cuts:
            parts.append(f"{len(self.cuts)} cut back to their length")
        if self.makes or self.links:
            parts.append(f"{len(self.makes) + len(self.links)} made again")
        if self.moved:
            parts.append(f"{len(self.moved)} moved aside")
        if self.left or self.problems or self.failed:
            parts.append(f"{len(self.left) + len(self.problems) + len(self.failed)} left as they are")
        if not parts:
            return None
        kept = f"; what they held after it is in {self.after_dir}/" if self.moved or self.copied else ""
        return ", ".join(parts) + kept

    # ---- deciding

    def file(self, path: str, entry: dict, source: Source, cur) -> None:
        """``path`` must be the file ``entry`` records."""
        if cur is not None and stat_.S_ISREG(cur.st_mode) and _key(cur) == _entry_key(entry):
            return  # untouched since
        record = source.buffers.get(entry.get("buffer") or "")
        if record is not None:
            if cur is not None and stat_.S_ISREG(cur.st_mode) and cur.st_size >= entry["size"] and _starts_with(path, record):
                if cur.st_size > entry["size"]:
                    self.cuts.append((path, entry["size"]))
                return  # the same bytes (then more, appended)
            if cur is not None and not self.in_place:
                self.moves.append(path)
            self.writes.append((path, entry, source))
            return
        copy = self.kept.get(path)
        if copy is not None:  # the replay removed, moved or rewrote it: kept before it did
            if cur is not None and not (self.in_place and disk.held(path, self.open_paths)):
                self.moves.append(path)
            self.restores.append((path, copy))
            return
        why = entry.get("why") or "not kept"
        if why == "too large":
            why = f"too large to keep ({_size(entry['size'])}; --files-max {_size(source.table.get('max_bytes'))} in all)"
        self.by_length(path, [entry["mode"], entry["size"], entry.get("mtime_ns"), entry.get("ino"), entry.get("tail")], cur,
                       f"its content at the snapshot was {why}")

    def by_length(self, path: str, before: list, cur, why: str) -> None:
        """A file known by its length and last bytes only: cut back if it only grew."""
        mode, size, mtime_ns, ino, tail = before
        if cur is not None and stat_.S_ISREG(cur.st_mode) and cur.st_ino == ino:
            if cur.st_size == size and cur.st_mtime_ns == mtime_ns:
                return
            if cur.st_size >= size and (size == 0 or watch.tail_digest(path, size) == tail):
                if cur.st_size > size:
                    self.cuts.append((path, size))
                return
        what = "removed" if cur is None else "rewritten"
        self.problems.append((path, f"{what} after the snapshot, and {why}"))

    def absent(self, path: str, cur) -> None:
        if cur is not None:
            self.moves.append(path)

    def directory(self, path: str, entry: dict, cur, excluded) -> None:
        if cur is None or not stat_.S_ISDIR(cur.st_mode):
            if cur is not None:
                self.moves.append(path)
            self.makes.append((path, stat_.S_IMODE(entry.get("mode") or 0o755)))
            return
        names = entry.get("names")
        if names is None:
            return
        keep = set(names)
        for name in _listdir(path):
            inner = os.path.join(path, name)
            if name not in keep and not excluded(inner):
                self.moves.append(inner)

    def link(self, path: str, entry: dict, cur) -> None:
        if cur is not None and stat_.S_ISLNK(cur.st_mode) and os.readlink(path) == entry["target"]:
            return
        if cur is not None:
            self.moves.append(path)
        self.links.append((path, entry["target"]))

    # ---- carrying it out

    def prefetch(self) -> None:
        """Read every content to write back from the store now: a damaged snapshot refuses the
        restart (ChunkMissing, ChunkCorrupt: exit 4) before any file has changed."""
        for path, entry, source in self.writes:
            self.contents[path] = source.read_buffer(source.buffers[entry["buffer"]])

    def apply(self) -> None:
        """Carry the plan out: moves first (parents before what they hold), then directories,
        contents, cuts and links. A step that fails is listed in ``failed`` and the steps on the
        same path after it are not taken (a file not moved aside is never written over)."""
        done: list[str] = []
        for path in sorted(set(self.moves), key=lambda p: (p.count("/"), p)):
            if any(path == d or path.startswith(d + "/") for d in done):
                continue  # moved with its directory
            if self.after_dir.startswith(path + "/"):
                continue  # the run directory's own
            if self.in_place and disk.held(path, self.open_paths):
                self.left.append((path, "the program holds it open"))
                continue
            to = self._try(path, disk.move_aside, path, self.after_dir)
            if to is not None:
                self.moved.append((path, to))
                done.append(path)
        for path, mode in sorted(self.makes):
            self._try(path, disk.make_dir, path, mode)
        for path, copy in self.restores:
            self._try(path, preserve.put, path, copy, self.in_place and disk.held(path, self.open_paths))
        for path, entry, source in self.writes:
            write = disk.write_in_place if self.in_place else disk.write_new
            self._try(path, lambda: write(path, self.contents.pop(path, None) or source.read_buffer(source.buffers[entry["buffer"]]),
                                          stat_.S_IMODE(entry["mode"])))
        for path, length in self.cuts:
            if not self.in_place:
                copy = self._try(path, disk.copy_aside, path, self.after_dir)
                if copy is None:
                    continue
                self.copied.append((path, copy))
            self._try(path, disk.cut, path, length, self.in_place)
        for path, target in self.links:
            self._try(path, disk.link, path, target)

    def _try(self, path: str, step, *args):
        if any(path == f or path.startswith(f + "/") for f, _ in self.failed):
            return None
        try:
            return step(*args)
        except (OSError, GpusnapError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.failed.append((path, f"could not be put back: {why}"))
            return None


# ---- the two passes


def rollback(sources: list[Source], after_dir: str, force: bool, leave=lambda path: False, settled=(), kept=None) -> Plan:
    """Plan putting the files of ``sources`` (lowest rank first: a path in several ranks' tables
    is put back by the first's, one only their journals name by the rank that touched it first)
    back to their snapshots' state, but those ``leave(path)`` names (the
    restart's own ``--files-exclude``) and those ``settled`` names (the file tables another
    supervisor of this host has put back for the same restart); refuse when some cannot be,
    unless ``force``. ``kept``: copies an earlier restart's replay kept (``preserve.left_by``).
    The caller applies the plan."""
    plan = Plan(after_dir, in_place=False, kept=kept or {})
    decided: set[str] = {e["path"] for table in settled for e in table.get("entries") or ()}
    read = []
    for source in sources:
        recorded = excludes_of(source.table)
        excluded = lambda path, recorded=recorded: recorded(path) or leave(path)  # noqa: E731
        entries = {e["path"]: e for e in source.table.get("entries") or ()}
        after = journal.after(source.journal, source.table.get("token"))
        if after.cut is not None:
            plan.cut.append((source, after.cut, _outlived([*entries, *after.paths], excluded)))
        read.append((source, excluded, entries, after, _missing_dirs(source, entries)))
    # A path in a snapshot's table goes back by it, whichever rank's journal touched it since.
    for source, excluded, entries, after, missing in read:
        for path, entry in sorted(entries.items()):
            if path in decided or leave(path):
                continue
            decided.add(path)
            if not missing(path, plan):
                _decide(plan, path, entry, source, excluded)
    # Any other by the rank that touched it first after the snapshot: it saw what was there then.
    # (Two ranks that save one checkpoint: rank 1 made `checkpoint_3/`, then rank 0 found it
    # there, and the directory made after the snapshot was left in place, empty.)
    first = _first_touches(read)
    for source, excluded, entries, after, missing in read:
        for path, before in sorted(after.paths.items()):
            if path in decided or first.get(path, source) is not source or excluded(path):
                continue
            decided.add(path)
            if missing(path, None):
                continue  # written after the snapshot on a disk that is not here
            cur = _lstat(path)
            if before is None:
                plan.absent(path, cur)
            elif stat_.S_ISREG(before[0]):
                plan.by_length(path, before, cur, "the program first wrote it then, so its content was never kept")
            elif stat_.S_ISDIR(before[0]) and (cur is None or not stat_.S_ISDIR(cur.st_mode)):
                plan.problems.append((path, "removed after the snapshot, and the program had not written into it "
                                            "before, so its content was never kept"))
    outlived = [(why, here) for _, why, here in plan.cut if here is not None]
    if outlived and not force:
        why, here = outlived[0]
        raise FilesNotRestorable(
            f"cannot put the program's files back as they were at snapshot {sources[0].snap_id}: {why}, so what the "
            f"program first wrote since is unknown, and its files outlived the machine that wrote them ({here} is here)",
            "restart with --force to put back what is known and leave the rest as it is; a run whose files outlive "
            "its machine keeps its local level (GPUSNAP_LEVEL_DIR) beside them, and the journal with it",
            problems=[(here, why)])
    if plan.problems:
        if not force:
            path, why = plan.problems[0]
            more = f" ({len(plan.problems) - 1} more files cannot be either)" if len(plan.problems) > 1 else ""
            gone = why.startswith("recorded by ")
            raise FilesNotRestorable(f"cannot put {path} back as it was at snapshot {sources[0].snap_id}: it was {why}{more}",
                                     _GONE_HINT if gone else None, problems=plan.problems)
    return plan


def _first_touches(read: list) -> dict:
    """path -> the source whose journal touched it first after the snapshot, by when (a
    journal written before 2026-12-03 says nothing of it, and the lowest rank's counts)."""
    seen: dict = {}
    for order, (source, _, _, after, _) in enumerate(read):
        for path in after.paths:
            key = (after.at.get(path, 0), order)
            if path not in seen or key < seen[path][0]:
                seen[path] = (key, source)
    return {path: source for path, (_, source) in seen.items()}


def before_replay(rd, snap_id: str, force: bool, leave=lambda path: False, shared=None, ranks=None) -> Plan | None:
    """Put the files of snapshot ``snap_id`` of run directory ``rd`` back, but those
    ``leave(path)`` names, and return what was done; None when the snapshot has no file table,
    or another node's supervisor on this host is doing it for the same restart. In a distributed
    run, ``ranks`` are those this node runs, whose files it puts back wherever they were
    recorded; None (the rendezvous assigns them): those of every shard recorded on this host.
    Refuses (``FilesNotRestorable``) as ``rollback`` does, before changing anything.
    ``shared``: the store's backend of a run on an object store, whose ``after-<id>/`` names are
    taken too."""
    from gpusnap.store import shards

    if not shards.is_sharded(rd):  # the supervisor holds the run's lock
        return _put_back([(rd, rd.load_manifest(snap_id))], after_dir(rd, snap_id, shared), snap_id, force, leave,
                         kept=preserve.left_by(str(rd.path), snap_id))
    host = socket.gethostname()
    pairs = {}
    for rank, sid in sorted(shards.shards_of(rd.load_manifest(snap_id)).items()):
        if ranks is None or rank in ranks:
            shard = shards.open_shard(rd, rank, trusted=True)
            m = shard.load_manifest(sid)
            if m.get("files") and (ranks is not None or m["files"].get("host") in (None, host)):
                pairs[rank] = (shard, m)
    # The nodes of a job share the run directory, and two may share a host: each puts back the
    # files of the ranks that the mark (their supervisor alive) does not name yet.
    mark = os.path.join(str(rd.path), f"files-{host}.json")
    fd = os.open(os.path.join(str(rd.path), f"files-{host}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with open(mark) as f:
                found = json.load(f)
        except (OSError, ValueError):
            found = {}
        done = {int(rank): pid for rank, pid in (found.get("ranks") or {}).items()
                if found.get("snapshot") == snap_id and lifeline.alive(pid)}
        todo = {rank: pair for rank, pair in pairs.items() if rank not in done}
        if not todo:
            return None
        settled = [pairs[rank][1]["files"] for rank in done if rank in pairs]
        plan = _put_back([(*pair, rank) for rank, pair in sorted(todo.items())], after_dir(rd, snap_id), snap_id, force,
                         leave, settled)
        from gpusnap import atomic

        done.update({rank: os.getpid() for rank in todo})
        atomic.write_file(mark, [json.dumps({"snapshot": snap_id, "ranks": done}).encode()])
        return plan
    finally:
        os.close(fd)


def ours(table: dict, config: dict) -> bool:
    """Are the files of ``table`` (the trainee's) this process's to settle? A single-process
    run's are, wherever it restarts, and a rank's that its node put back; where nodes put back
    the files recorded on their host (``by_host`` in the boot configuration), a rank's only on
    the host that recorded them."""
    return not (config.get("files") or {}).get("by_host") or table.get("host") in (None, socket.gethostname())


def refused_elsewhere(table: dict, config: dict, rank, snap_id: str) -> FilesNotRestorable | None:
    """A rank's refusal, before the replay, of files recorded on another host that no node put
    back for it: the rendezvous placed it only after the nodes had put back the files recorded
    on their hosts."""
    if ours(table, config) or not table.get("entries") or config.get("force"):
        return None
    here = socket.gethostname()
    return FilesNotRestorable(
        f"cannot put the files of rank {rank} back as they were at snapshot {snap_id}: they were recorded on "
        f"{table.get('host')}, and this job runs rank {rank} on {here} (the rendezvous assigns ranks to nodes after the "
        "files are put back)",
        "give each node its --node-rank (a static rendezvous) to have each node put back its ranks' files, or restart "
        "with --force to go on without them")


def _source(shard, m: dict, host: str | None = None, rank=None) -> Source:
    recorded = m["files"].get("host")
    elsewhere = f"rank {rank} on {recorded}" if rank is not None and recorded not in (None, host) else None
    return Source(m["id"], m["files"], m.get("buffers") or {}, _reader(shard, m["id"]), journal.read(shard), elsewhere)


def _put_back(pairs: list, after: str, snap_id: str, force: bool, leave, settled=(), kept=None) -> Plan | None:
    """``pairs``: (run directory or shard, its manifest[, the rank it holds])."""
    held = {}  # id(source) -> (source, the run directory or shard whose journal it read)
    host = socket.gethostname()
    for shard, m, *rank in pairs:
        if m.get("files"):
            source = _source(shard, m, host, *rank)
            held[id(source)] = (source, shard)
    if not held:
        return None
    plan = rollback([source for source, _ in held.values()], after, force, leave, settled, kept)
    plan.prefetch()
    plan.apply()
    if plan.failed and not force:
        path, why = plan.failed[0]
        more = f" ({len(plan.failed) - 1} more could not either)" if len(plan.failed) > 1 else ""
        raise FilesNotRestorable(f"cannot put {path} back as it was at snapshot {snap_id}: it {why}{more}",
                                 f"fix the cause and restart again (what was moved aside is in {plan.after_dir}/), "
                                 "or pass --force to go on with such files as they are", problems=plan.failed, plan=plan)
    for source, _, _ in plan.cut:
        journal.restarted(held[id(source)][1], snap_id)  # the cut is settled: the files are as far as known
    return plan


def _reader(rd, snap_id: str):
    """``read_buffer`` of run directory ``rd`` whose errors name snapshot ``snap_id``."""
    return lambda record: rd.read_buffer(record, snapshot=snap_id)


def after_dir(rd, snap_id: str, shared=None) -> str:
    """``DIR/after-<id>``, or ``-2``, ``-3``... when an earlier restart from the same snapshot
    moved files there already: in this directory, or, for a run on an object store, in the store
    (``shared``), where another machine's restart may have put its ``after-<id>/``."""
    name = f"{AFTER}{snap_id}"
    n = 1
    while any(_holds(b, name) for b in (rd.backend, shared) if b is not None):
        n += 1
        name = f"{AFTER}{snap_id}-{n}"
    return os.path.join(str(rd.path), name)


def _holds(backend, name: str) -> bool:
    """Is ``name`` taken in ``backend``: a file or directory, or a prefix with objects under it?"""
    if backend.exists(name):  # a local directory too: one stat, whatever it holds
        return True
    try:
        backend.list(name)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def settle(source: Source, after_dir: str, kept=None) -> Plan:
    """Plan undoing what the replay wrote before the merge (``watch.notes``: this process's and
    its workers'): the paths it touched go back to the snapshot's state, in place; ``kept``: the
    copies ``preserve`` kept of files the snapshot holds by length only."""
    watch.merge_journal()
    disk.flush_writers(watch.notes)
    plan = Plan(after_dir, in_place=True, open_paths=disk.open_paths(), kept=kept or {})
    excluded = excludes_of(source.table)
    entries = {e["path"]: e for e in source.table.get("entries") or ()}
    for path, note in sorted(watch.notes.items()):
        entry = entries.get(path)
        if entry is not None:
            _decide(plan, path, entry, source, excluded)
        elif note.before is None:
            plan.absent(path, _lstat(path))
        elif stat_.S_ISREG(note.before[0]):
            plan.by_length(path, note.before, _lstat(path), "the replay wrote it")
    # What was under a directory the replay removed, renamed away or replaced (a setup that
    # rotates the last run's directory, `os.rename(run_dir, run_dir + ".old")`): the replay never
    # touched those paths by name, and they stayed missing after the merge (corpus/clean_start.py
    # --rotate, 2 of 2).
    gone = {path for path, note in watch.notes.items() if note.kinds & {"moved", "remove", "replaced"}}
    for path, entry in entries.items():
        if path not in watch.notes and any(at in gone for at in ancestors(path)):
            _decide(plan, path, entry, source, excluded)
    for path, entry in entries.items():
        if entry.get("kind") == "dir" and entry.get("names") is not None and path not in watch.notes:
            plan.directory(path, entry, _lstat(path), excluded)  # what the replay's native writers made there
    return plan  # its problems are the replay's own writes: said, never a refusal


def _decide(plan: Plan, path: str, entry: dict, source: Source, excluded) -> None:
    cur = _lstat(path)
    kind = entry.get("kind")
    if kind == "file":
        plan.file(path, entry, source, cur)
    elif kind == "dir":
        plan.directory(path, entry, cur, excluded)
    elif kind == "link":
        plan.link(path, entry, cur)


_GONE_HINT = ("restart where that directory is (the program's output on a file system every node mounts), or with "
              "--force to go on without the files that cannot be put back")


def _missing_dirs(source: Source, entries: dict):
    """``missing(path, plan)`` for a rank's table recorded on another host: is the directory
    ``path`` would be put back in missing here (the disk of a node that is gone)? The first
    path of each such directory goes into ``plan.problems``."""
    if source.elsewhere is None:
        return lambda path, plan: False
    made = {path for path, entry in entries.items() if entry.get("kind") == "dir"}
    said: set[str] = set()

    def missing(path: str, plan) -> bool:
        parent = os.path.dirname(path)
        while parent in made:  # the program made it: it is put back with the rest
            parent = os.path.dirname(parent)
        if os.path.isdir(parent):
            return False
        if plan is not None and parent not in said:
            said.add(parent)
            why = f"recorded by {source.elsewhere}, and its directory {parent} is not here (a disk of that node?)"
            plan.problems.append((path, why))
        return True

    return missing


def excludes_of(table: dict) -> Excludes:
    return Excludes.from_saved(table.get("exclude") or {})


def _outlived(paths, excluded) -> str | None:
    """The first of ``paths`` (the run's files, as its snapshot and journal know them) that is
    here as a file or link: the files outlived the machine that wrote them. Directories do not
    count: a fresh copy of the program may hold its output directories already."""
    for path in sorted(paths):
        if excluded(path):
            continue
        cur = _lstat(path)
        if cur is not None and not stat_.S_ISDIR(cur.st_mode):
            return path
    return None


# ---- reading the file system


def _lstat(path: str):
    try:
        return os.lstat(path)
    except OSError:
        return None


def _key(st) -> tuple:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _entry_key(entry: dict) -> tuple:
    return (entry.get("ino"), entry.get("size"), entry.get("mtime_ns"), entry.get("ctime_ns"))


def _starts_with(path: str, record: dict) -> bool:
    """Does the file at ``path`` begin with the bytes of ``record`` (a stored buffer)? By the
    chunks' ids, the digests of their bytes: nothing is read from the store."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        at = 0
        for cid, nbytes in record["chunks"]:
            data = os.pread(fd, nbytes, at)
            if len(data) != nbytes or xxhash.xxh3_128_hexdigest(data) != cid:
                return False
            at += nbytes
        return True
    finally:
        os.close(fd)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _size(nbytes) -> str:
    nbytes = nbytes or 0
    if nbytes < 10**6:
        return f"{nbytes} bytes"
    return f"{nbytes / 1e6:.1f} MB" if nbytes < 10**9 else f"{nbytes / 1e9:.2f} GB"
