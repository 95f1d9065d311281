"""``gpusnap verify --replay`` leaves the program's files as it found them.

A verify runs the program's setup again and trains the witness's iterations, in the program's
own working directory: it appends to its logs, rewrites its results, saves and rotates its
checkpoints, as a restart would. A restart then puts the files back to the snapshot's state;
a verify must not (the run it checks may have gone on long after the snapshot, and its files
with it). So while a guard directory is set, the first write the audit hook sees to each path,
in the trainee or any process it forked, first keeps what is there: a copy of a file, of a
directory that is removed or moved, a link's target, or that nothing was there. Each kept path
is one line in ``<guard>/kept.jsonl``. Once the verify's trainee has exited, however it ended,
``put_back`` returns every path to what was kept.

What the audit hook does not see (``watch``'s docstring), and paths the run excludes, are left
as the verify wrote them.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import stat as stat_

from gpusnap import atomic

GUARD_DIR = "verify-guard"  # in the verify's scratch run directory
KEPT = "kept.jsonl"

_dir: str | None = None
_kept: set[str] = set()
_busy = False  # the copies' own opens raise audit events too


def install(guard_dir: str) -> None:
    """Keep the first-written state of every path from now on (the verify's trainee, at boot)."""
    global _dir
    os.makedirs(guard_dir, mode=0o700, exist_ok=True)
    _dir = guard_dir


def uninstall() -> None:
    global _dir
    _dir = None
    _kept.clear()


def keep(path: str, kind: str) -> None:
    """Before the first write to ``path`` of kind ``kind`` (``watch``'s kinds): keep what is there."""
    global _busy
    if _dir is None or _busy or path in _kept:
        return
    _kept.add(path)
    _busy = True
    try:
        records = [_keep(path, kind)]
        # The directories a write makes on the way (os.makedirs, a restart writing a file back).
        parent = os.path.dirname(path)
        while parent not in _kept and parent != os.path.dirname(parent) and not os.path.lexists(parent):
            _kept.add(parent)
            records.append({"path": parent, "was": "absent"})
            parent = os.path.dirname(parent)
        note_kept(_dir, records)
    finally:
        _busy = False


def note_kept(folder: str, records: list) -> None:
    """A line per record in ``folder``'s ``kept.jsonl``, in one write: the lines of the trainee
    and its workers stay whole. (Also the replay's keeping: ``preserve``.)"""
    fd = os.open(os.path.join(folder, KEPT), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, "".join(json.dumps(r) + "\n" for r in records).encode())
    finally:
        os.close(fd)


def read_kept(folder: str) -> list[dict]:
    """The records of ``folder``'s ``kept.jsonl``, in order; none where there is none."""
    try:
        with open(os.path.join(folder, KEPT), "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a kill: its path was not yet written
    return records


def _keep(path: str, kind: str) -> dict:
    try:
        st = os.lstat(path)
    except OSError:
        return {"path": path, "was": "absent"}
    copy = os.path.join(_dir, f"{os.getpid()}-{len(_kept)}")
    if stat_.S_ISLNK(st.st_mode):
        return {"path": path, "was": "link", "target": os.readlink(path)}
    if stat_.S_ISDIR(st.st_mode):
        if kind not in ("remove", "moved"):
            return {"path": path, "was": "dir"}  # what is written inside is kept path by path
        shutil.copytree(path, copy, symlinks=True)
        return {"path": path, "was": "dir", "copy": copy}
    if stat_.S_ISREG(st.st_mode):
        shutil.copy2(path, copy, follow_symlinks=False)
        return {"path": path, "was": "file", "copy": copy}
    return {"path": path, "was": "other"}  # a fifo or a device: nothing a write changes to keep


def put_back(guard_dir: str) -> tuple[int, list[tuple[str, str]]]:
    """Return every kept path to its kept state. Returns (paths put back, [(path, why)] that
    could not be)."""
    first: dict[str, dict] = {}
    for record in read_kept(guard_dir):
        first.setdefault(record["path"], record)
    failed = []
    # Whole directories first, outermost first; then single paths, deepest first (what the verify
    # made inside a directory goes before the directory), so that a path kept before its
    # directory was removed ends as it was at its own first write.
    def depth(item):
        return item[0].count("/")

    trees = sorted((i for i in first.items() if _is_tree(i[1])), key=depth)
    single = sorted((i for i in first.items() if not _is_tree(i[1])), key=depth, reverse=True)
    for path, record in trees + single:
        try:
            _put(path, record)
        except OSError as exc:
            failed.append((path, exc.strerror or str(exc)))
    return len(first) - len(failed), failed


def _is_tree(record: dict) -> bool:
    """A directory kept whole (it was removed or moved), not path by path."""
    return record["was"] == "dir" and "copy" in record


def _put(path: str, record: dict) -> None:
    was = record["was"]
    if was == "other":
        return
    if was == "dir" and not _is_tree(record):
        os.makedirs(path, exist_ok=True)
        return
    _clear(path)
    if was == "absent":
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if was == "link":
        os.symlink(record["target"], path)
    elif was == "dir":
        shutil.copytree(record["copy"], path, symlinks=True)
    else:
        put_copy(record["copy"], path)


def put_copy(copy: str, path: str) -> None:
    """The kept ``copy`` at ``path`` in its place: renamed there, or, from another file system
    than the program's file, copied whole or not at all, with its mode and times."""
    try:
        os.replace(copy, path)
    except OSError:
        with mapped(copy) as (data, mode):
            atomic.write_file(path, [data], mode=mode)
        shutil.copystat(copy, path)


@contextlib.contextmanager
def mapped(path: str):
    """(a read-only map of the file at ``path``, its mode bits): a checkpoint of many GB is read
    through the page cache, not copied into memory."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        with mmap.mmap(f.fileno(), st.st_size, access=mmap.ACCESS_READ) if st.st_size else contextlib.nullcontext(b"") as data:
            yield data, stat_.S_IMODE(st.st_mode)


def _clear(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat_.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
