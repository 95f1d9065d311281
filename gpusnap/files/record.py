"""The snapshot's file table: what a restart needs to put the program's files back.

In the stall (``stage``, the trainee, before the fork): the journal's marker is written and the
workers' lines read; every path the program has written (``watch.notes``, and everything under
a directory the program made, which native writers fill unseen) is looked at once (``lstat``). A
file whose size, times and inode are those of the last committed snapshot's entry is taken as it
was (its chunks are reused: it costs nothing). A changed one is kept, smallest first, while the
kept files stay within ``--files-max`` in all: read now when it is small
(``knobs.FILES_STALL_READ_BYTES``), else handed to the writer as an open descriptor (the inode as
it is now, whatever the program renames onto its path later). A file the program only appended
to since the last snapshot is read from its last whole chunk on: the chunks before it are the
last snapshot's. A file over the budget is recorded by its length and the digest of its last
bytes only (enough to truncate an appended log back).

In the writer (``put``): each kept file becomes a buffer (``file/<n>``, ``kind`` ``file``) through
the store's chunks, so that an unchanged file, or the unchanged start of a growing one, is never
written twice. A file read through its descriptor whose time changed meanwhile is kept only if
it can only have grown (the shared rewrite counter did not move, and the hook saw its writes):
one rewritten in place while the writer read it is left to the next snapshot. The table goes
into the manifest as ``files`` (docs/FORMAT.md).
"""

from __future__ import annotations

import os
import socket
import stat as stat_
from dataclasses import dataclass, field

import xxhash

from gpusnap import knobs
from gpusnap.files import disk, watch

_pending = None  # the last staged FilesJob, until the next stage knows whether it committed
_committed: dict[str, tuple] = {}  # path -> (ino, size, mtime_ns, ctime_ns) kept by the last committed snapshot
_committed_id: str | None = None  # which snapshot that is
_committed_rewrites = 0  # the shared rewrite counter at its stall
max_bytes = 512 << 20  # --files-max, set by install
CHILD_UNCHANGED = "not kept: only a process the program started was handed its name, and it had not changed"


@dataclass
class FilesJob:
    """What the stall decided, read by the writer from its image."""

    snap_id: str
    token: str
    entries: list  # table entries (dicts), files without their buffers yet
    read: dict = field(default_factory=dict)  # path -> bytes read in the stall
    fds: dict = field(default_factory=dict)  # path -> (fd, start): the writer reads bytes start.. through fd
    previous: str | None = None  # the committed snapshot whose table holds the reused chunks
    rewrites: int = 0  # the shared rewrite counter at the stall
    kept: dict = field(default_factory=dict)  # path -> stat key of what this snapshot keeps
    kept_bytes: int = 0
    stall_read_bytes: int = 0


def install(files_max: int) -> None:
    global max_bytes
    max_bytes = int(files_max)


def resumed(snap_id: str, table: dict) -> None:
    """A restart merged snapshot ``snap_id``: its files are this run's too, and those it left as
    they were are reused by the next snapshot."""
    global _committed, _committed_id
    _committed = {}
    for entry in table.get("entries") or ():
        unchanged = entry.get("why") == CHILD_UNCHANGED
        before = [entry["mode"], entry["size"], entry["mtime_ns"], entry["ino"], entry.get("tail")] if unchanged else None
        watch.adopt(entry["path"], bool(entry.get("made")), entry.get("kind"), bool(entry.get("child")), before)
        if entry.get("kind") == "file" and entry.get("buffer"):
            _committed[entry["path"]] = _key_of(entry)
    _committed_id = snap_id


def _key_of(entry: dict) -> tuple:
    return (entry.get("ino"), entry.get("size"), entry.get("mtime_ns"), entry.get("ctime_ns"))


def _key(st) -> tuple:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def stage(snap_id: str, rundir_path) -> FilesJob | None:
    """The file table of snapshot ``snap_id``, decided in the stall. None when not watching."""
    global _pending, _committed, _committed_id, _committed_rewrites
    if not watch.active():
        return None
    if _pending is not None:
        if os.path.exists(os.path.join(rundir_path, "snapshots", f"{_pending.snap_id}.json")):
            _committed, _committed_id, _committed_rewrites = _pending.kept, _pending.snap_id, _pending.rewrites
        _pending = None
    token = watch.mark(snap_id)
    disk.flush_writers(watch.notes)  # what the program's file objects still buffer is the file's
    watch.forget_gone_temps()
    job = FilesJob(snap_id, token, [], previous=_committed_id, rewrites=watch.rewrites())
    files = []
    for path, made in _paths():
        try:
            st = os.lstat(path)
        except OSError:
            # Gone: nothing to put back. Should it come back after this snapshot, the journal
            # says so (a path's first line after the marker), and a restart moves it aside.
            watch.notes.pop(path, None)
            continue
        entry = {"path": path, "mode": st.st_mode, "made": made}
        if stat_.S_ISDIR(st.st_mode):
            entry["kind"] = "dir"
            if made:
                entry["names"] = sorted(_names(path))
        elif stat_.S_ISLNK(st.st_mode):
            entry.update(kind="link", target=os.readlink(path))
        elif stat_.S_ISREG(st.st_mode):
            entry.update(kind="file", size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino)
            files.append((entry, st))
        else:
            continue  # a socket, fifo or device is no file to put back
        job.entries.append(entry)
    _keep(job, files)
    _pending = job
    return job


def _paths():
    """(path, made), sorted, of every path the program wrote, and of everything under the
    directories it made (native writers fill them unseen) or renamed into place: a checkpoint
    written into `ckpt.tmp/` and renamed to `ckpt/` (as atomic saves are) had none of its
    files in the table, and a restart after the next epoch's save refused ("... was rewritten
    after the snapshot, and the program first wrote it then"; corpus/zip_archive.py, 2 of 3)."""
    seen = {path: note.made for path, note in list(watch.notes.items())}
    for path, made in list(seen.items()):
        kinds = watch.notes[path].kinds if path in watch.notes else ()
        if (made and "mkdir" in kinds) or ("replaced" in kinds and _real_dir(path)):
            for inner in _walk(path):
                seen.setdefault(inner, True)
    return sorted(seen.items())


def _real_dir(path: str) -> bool:
    """A directory, not a link to one (whose target is not the program's to walk)."""
    try:
        return stat_.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _walk(top: str):
    """Everything under ``top`` that is not excluded."""
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for entry in entries:
        if watch.skipped(entry.path):
            continue
        yield entry.path
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(entry.path)


def _names(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _keep(job: FilesJob, files: list) -> None:
    """Keep the files' contents, smallest first, within max_bytes; the rest by length and tail."""
    total = 0
    for entry, st in sorted(files, key=lambda pair: pair[0]["size"]):
        path, size = entry["path"], st.st_size
        note = watch.notes.get(path)
        if note is not None and "child" in note.kinds:
            entry["child"] = True
            if note.kinds == {"child"} and _as_before(note.before, st):
                # Only handed to a process the program started, and as it was then (an input,
                # most often: a script, a dataset's file): its length and last bytes tell a
                # restart whether a later child appended to it or rewrote it.
                entry["why"] = CHILD_UNCHANGED
                entry["tail"] = note.before[4]
                continue
        if total + size > max_bytes:
            entry["why"] = "too large"
            entry["tail"] = watch.tail_digest(path, size)
            continue
        total += size
        key = _key(st)
        job.kept[path] = key
        if _committed.get(path) == key:
            continue  # unchanged since the last committed snapshot: its chunks
        if size <= knobs.FILES_STALL_READ_BYTES:
            data = _read(path, st)
            if data is None:
                del job.kept[path]
                entry["why"] = "unreadable"
                continue
            job.read[path] = data
            job.stall_read_bytes += len(data)
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            if os.fstat(fd).st_ino != st.st_ino:  # replaced since the lstat: not the file recorded
                os.close(fd)
                raise OSError
        except OSError:
            del job.kept[path]
            entry["why"] = "unreadable"
            continue
        before = _committed.get(path)
        start = 0
        if before and before[0] == st.st_ino and before[1] <= size and _grown_only(watch.notes.get(path), _committed_rewrites):
            start = (before[1] // knobs.CHUNK_BYTES) * knobs.CHUNK_BYTES  # below it: the last snapshot's chunks
        job.fds[path] = (fd, start)
    job.kept_bytes = total


def _as_before(before, st) -> bool:
    return before is not None and (before[1], before[2], before[3]) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _grown_only(note, since: int) -> bool:
    """Has the file only grown since the shared rewrite counter stood at ``since`` (no rewrite in
    place)? Not known for a file the hook never saw written (a native writer's in a directory
    the program made, or one a process the program started was handed): its bytes may have
    changed anywhere."""
    return note is not None and note.rewritten_at <= since and "child" not in note.kinds


def _read(path: str, st) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_ino != st.st_ino:
            return None
        parts, left = [], st.st_size
        while left > 0:
            part = os.read(fd, min(left, 1 << 24))
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def forked(job: FilesJob | None) -> None:
    """The writer has its copies of the descriptors (or was never started): close ours."""
    if job is None:
        return
    for fd, _ in job.fds.values():
        try:
            os.close(fd)
        except OSError:
            pass


# ---- in the writer -------------------------------------------------------------------------


def put(job: FilesJob, sink, rundir) -> tuple[dict, dict]:
    """Store the kept files through ``sink``; return (the manifest's ``files`` table, buffers)."""
    previous = {}
    if job.previous is not None:
        try:
            manifest = rundir.load_manifest(job.previous)
        except Exception:  # noqa: BLE001 - pruned or unreadable: nothing to reuse, read instead
            manifest = {}
        table, buffers = manifest.get("files") or {}, manifest.get("buffers") or {}
        for entry in table.get("entries") or ():
            if entry.get("buffer") in buffers:
                previous[entry["path"]] = (entry, buffers[entry["buffer"]])
    buffers: dict = {}
    late = []  # files read through descriptors: checked once all are read
    for n, entry in enumerate(e for e in job.entries if e.get("kind") == "file" and e["path"] in job.kept):
        path = entry["path"]
        try:
            record = _put_file(job, entry, sink, previous.get(path), late)
        except OSError:  # a disk that fails one file's read fails that file, not the snapshot
            record = None
        if record is None:
            entry["why"] = "unreadable"
            continue
        if record["nbytes"] != entry["size"]:
            entry["why"] = "changed while the snapshot was written"
            continue
        name = f"file/{n}"
        buffers[name] = {**record, "kind": "file", "path": f"file:{path}"}
        entry["buffer"] = name
    moved = watch.rewrites() != job.rewrites
    for entry, fd in late:
        try:
            changed = os.fstat(fd).st_mtime_ns != entry["mtime_ns"]
        except OSError:
            changed = True
        # A file that only grew while it was read keeps the bytes below its length; one that may
        # have been rewritten in place meanwhile (the shared counter moved; or a file written by
        # code the hook does not see) is not kept this time: the next snapshot keeps it.
        if changed and entry.get("buffer") and (moved or not _grown_only(watch.notes.get(entry["path"]), job.rewrites)):
            buffers.pop(entry.pop("buffer"), None)
            entry["why"] = "changed while the snapshot was written"
    kept = sum(e["size"] for e in job.entries if e.get("buffer"))
    table = {"host": socket.gethostname(), "token": job.token, "max_bytes": max_bytes, "kept_bytes": kept,
             "stall_read_bytes": job.stall_read_bytes, "exclude": watch.excludes().saved(), "entries": job.entries}
    return table, buffers


def _put_file(job: FilesJob, entry: dict, sink, old, late: list) -> dict | None:
    """One kept file into the store: the bytes read in the stall, or read now through the
    stall's descriptor, or the chunks of the snapshot that kept it unchanged (``old``: its
    table entry and buffer). A file read now goes into ``late``, to be checked after."""
    path = entry["path"]
    if path in job.read:
        return sink.put_buffer(job.read[path], dtype="bytes", typesize=1)
    if path in job.fds:
        fd, start = job.fds[path]
        late.append((entry, fd))
        return sink.put_chunks(_pieces(fd, start, entry["size"], old), dtype="bytes", typesize=1)
    if old is not None and _key_of(old[0]) == _key_of(entry):
        return sink.put_chunks([tuple(c) for c in old[1]["chunks"]], dtype="bytes", typesize=1)
    # The snapshot that kept it is gone (pruned): read it now, and check it after.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    late.append((entry, fd))
    return sink.put_chunks(_pieces(fd, 0, entry["size"], None), dtype="bytes", typesize=1)


def _pieces(fd: int, start: int, size: int, old):
    """The chunks of a file read through ``fd``: the old record's whole chunks below ``start``,
    then the bytes from ``start`` to ``size``."""
    chunk = knobs.CHUNK_BYTES
    at = 0
    if start and old is not None:
        reuse = []
        for cid, nbytes in old[1]["chunks"]:
            if at >= start or nbytes != chunk:
                break
            reuse.append((cid, nbytes))
            at += nbytes
        # The first and the last of them read again: a file rewritten rather than appended to
        # (a CSV's new header) does not pass as grown.
        if reuse and all(xxhash.xxh3_128_hexdigest(os.pread(fd, chunk, i * chunk)) == reuse[i][0] for i in {0, len(reuse) - 1}):
            yield from reuse
        else:
            at = 0
    while at < size:
        data = os.pread(fd, min(chunk, size - at), at)
        if not data:
            return  # shorter than its length at the stall: put() sees the sizes differ
        yield data
        at += len(data)
