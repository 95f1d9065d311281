"""What the program writes, as it writes it: an audit hook (``sys.addaudithook``), installed by
boot before the program's first line, and inherited by every process the program forks
(DataLoader workers, the snapshot writer).

The hook sees ``open`` (``open()``, ``io.open``, ``os.open``, ``pathlib``'s writes), renames and
replaces, removals (``os.remove``, ``os.rmdir``, ``shutil.rmtree``), ``os.mkdir``,
``os.truncate``, links and writable ``mmap``s; calls that only read are passed over. Native
writers whose paths pass through Python are named by their adapters (``note_write``:
``gpusnap/frameworks/savers.py``). Each path the program writes becomes a ``Note``: its state
before the program first touched it (``before``: mode, size, mtime, inode and a digest of its
last bytes, or None when it did not exist) and the kinds of touch seen since:

    append    opened for appending                 rewrite   written in place: a non-empty file
    write     opened for writing, new or empty               opened for writing without append,
    mkdir     made a directory                               truncated, or mapped writable
    remove    removed (os.remove, rmdir, rmtree)   moved     renamed away
    replaced  renamed (or linked) onto         child     named on the command line of a process
                                                         the program started (``commands``)

Every first sight of a path, and every new kind of touch, is appended to the run's *journal*
(``DIR/files.jsonl``, one JSON object a line; a distributed rank's in its shard): the trainee's
own, which a restart reads to learn what the killed run wrote after its snapshot, and its
forked workers', which reach the trainee no other way (the trainee reads them at each
snapshot, ``merge_journal``). A snapshot writes a *marker* line into it (``mark``), which its
manifest names by token. The journal is a file of the run directory's local level, written
through one ``O_APPEND`` descriptor per process rather than the directory's backend: its lines
are written from inside the program's own calls, by several processes at once, and one
``write`` of a line to a local file is what keeps that cheap and each line whole (a run on an
object store gets it there by the levels' copy: ``journal``). One shared counter (anonymous shared memory, as ``graph.workers``)
counts rewrites in place in every process: the snapshot writer, which reads some files after the
fork, checks by it that none changed under it.

Left out: gpusnap's run directory and cache, paths the user excludes (``paths.Excludes``), and the
files and directories ``tempfile`` makes when library code asks for them (scratch: its
machinery, as multiprocessing's listener sockets, which the replay makes again and a restart
must not take away), though a scratch file renamed onto a kept path counts there. What
``tempfile`` makes for the program's own code is its state like any other file: a script that
keeps its epochs' weights or a loss log in a ``TemporaryDirectory`` reads them back, and such a
log appended after the snapshot, left alone, restarted "verified" with its lines twice
(``tests/programs/corpus/scratch_average.py``, 5 of 6). Unseen: writes by native code that is
handed a path without an adapter, by processes the program starts with exec (spawn and
forkserver workers; a subprocess's files that its command line does not name: ``commands``),
and through file descriptors inherited or passed in.
"""

from __future__ import annotations

import json
import mmap
import os
import stat as stat_
import struct
import sys
import time
import urllib.parse

import xxhash

from gpusnap import sources
from gpusnap.files import commands, guard, preserve
from gpusnap.files.journal import JOURNAL  # noqa: F401  (where install's caller puts it)
from gpusnap.files.paths import Excludes, ancestors, fd_path, normalize

# A file's last bytes before a length, digested: what shows that a file was only appended to
# since (a rewrite of a log or CSV changes its earlier lines).
TAIL_BYTES = 64 << 10
_WRITES = os.O_WRONLY | os.O_RDWR
_EVENTS = frozenset({
    "open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate",
    "os.link", "os.symlink", "mmap.__new__", "tempfile.mkstemp", "tempfile.mkdtemp", "sqlite3.connect",
    *commands.EVENTS,
})
_MAKES = frozenset({"append", "write", "mkdir", "replaced", "child"})
_IN_PLACE = frozenset({"rewrite", "child"})  # a child may rewrite in place: the shared counter says one may have


class Note:
    __slots__ = ("before", "kinds", "rewritten_at", "made")

    def __init__(self, before):
        self.before = before  # [mode, size, mtime_ns, ino, tail digest] before the first touch, or None
        self.kinds: set[str] = set()
        self.rewritten_at = 0  # the shared counter after this path's last rewrite in place
        self.made = False  # the program made it: it did not exist before the first touch


notes: dict[str, Note] = {}
_excluded: dict[str, bool] = {}
_excludes = None
_temp: set[str] = set()
_journal_fd = -1
_journal_path = ""
_read_at = 0  # how far the trainee has merged the journal
_counter = None
_pid = 0


def install(journal_path: str, excludes: Excludes) -> None:
    """Start watching (boot, before the program's first line); ``journal_path`` is appended to."""
    global _excludes, _journal_fd, _journal_path, _counter, _pid, _read_at
    if _journal_fd >= 0:
        return
    _excludes = excludes
    _journal_path = journal_path
    _journal_fd = os.open(journal_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    _read_at = os.fstat(_journal_fd).st_size  # earlier runs' lines are the restart's to read
    _counter = mmap.mmap(-1, 8)  # anonymous and MAP_SHARED: forked workers count into it
    _pid = os.getpid()
    sys.addaudithook(_hook)


def active() -> bool:
    return _journal_fd >= 0


def excludes() -> Excludes:
    return _excludes


def rewrites() -> int:
    """Rewrites in place so far, in the trainee and every process it forked."""
    return struct.unpack_from("<Q", _counter)[0] if _counter is not None else 0


def note_write(raw, truncate: bool = True) -> None:
    """A native writer is about to write the file ``raw`` names (an adapter's call)."""
    if _journal_fd >= 0:
        try:
            _write_open(normalize(raw), os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0))
        except Exception:  # noqa: BLE001 - watching must never fail the program's call
            pass


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS:
        return
    try:
        _on(event, args)
    except Exception:  # noqa: BLE001 - an exception here would fail the program's own call
        pass


def _on(event: str, args: tuple) -> None:
    if event == "open":
        path, _, flags = args
        if isinstance(path, int) or not flags & _WRITES:
            return
        _write_open(normalize(path), flags)
    elif event == "os.rename":
        src, dst, src_fd, dst_fd = args
        _touch(normalize(src, src_fd, follow=False), "moved")
        _touch(normalize(dst, dst_fd, follow=False), "replaced")
    elif event in ("os.remove", "os.rmdir", "shutil.rmtree"):
        _touch(normalize(args[0], args[1], follow=False), "remove")
    elif event == "os.mkdir":
        _touch(normalize(args[0], args[2], follow=False), "mkdir")
    elif event == "os.truncate":
        target = args[0]
        path = fd_path(target) if isinstance(target, int) else normalize(target)
        _touch(path, "rewrite" if _size(path) else "write")
    elif event in ("os.link", "os.symlink"):
        _touch(normalize(args[1], args[3] if event == "os.link" else args[2], follow=False), "replaced")
    elif event == "mmap.__new__":
        fileno, _, access, _ = args
        if fileno >= 0 and access != mmap.ACCESS_READ and access != mmap.ACCESS_COPY:
            _touch(fd_path(fileno), "rewrite")
    elif event in ("tempfile.mkstemp", "tempfile.mkdtemp") and _asked_by_library():
        _temp.add(normalize(args[0]))
    elif event == "sqlite3.connect":
        _sqlite(args[0])
    elif event in commands.EVENTS:  # a process started by exec, which writes unseen: the files its command names
        for path in commands.command_paths(event, args):
            _touch(normalize(path), "child")


def _sqlite(database) -> None:
    """SQLite writes its database natively, through the path it was opened by: the file, and
    the write-ahead log and its index where the database uses them (``-wal``, ``-shm``, which
    hold commits until a checkpoint moves them into the file). Each is a file rewritten in place."""
    name = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
    if name.startswith("file:"):  # a URI (uri=True): its path, unquoted
        name = urllib.parse.unquote(urllib.parse.urlsplit(name).path)
    if name in ("", ":memory:"):
        return
    for path in (name, f"{name}-wal", f"{name}-shm"):
        _write_open(normalize(path), os.O_RDWR)


_TEMPFILE = getattr(sys.modules.get("tempfile"), "__file__", None) or os.path.join(os.path.dirname(os.__file__), "tempfile.py")


def _asked_by_library() -> bool:
    """Whether the code that called ``tempfile`` (the first frame above tempfile's own) is the
    standard library's, an installed package's or gpusnap's, rather than the program's."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == _TEMPFILE or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return True
    return sources.library_code(frame.f_code.co_filename)


def _write_open(path: str | None, flags: int) -> None:
    if path is None:
        return
    if flags & os.O_APPEND:
        kind = "append"
    else:
        # A file with bytes in it, opened to write without appending, is rewritten in place
        # (truncated, or written over): its earlier content is gone, even from the same inode.
        kind = "rewrite" if _size(path) else "write"
    _touch(path, kind)


def _size(path: str | None) -> int:
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return 0
    return st.st_size if stat_.S_ISREG(st.st_mode) else 0


def _touch(path: str | None, kind: str) -> None:
    if path is None or skipped(path):
        return
    guard.keep(path, kind)  # nothing unless a verify set a guard
    preserve.keep(path, kind)  # nothing unless a replay guards what its snapshot holds by length only
    note = notes.get(path)
    line = None
    if note is None:
        note = notes[path] = Note(state_of(path))
        note.made = note.before is None and kind in _MAKES
        # `at`: when, by the wall clock the ranks of a node share: of the ranks that touched a
        # path after a snapshot, the first saw what the snapshot's moment left there.
        line = {"path": path, "kind": kind, "pid": os.getpid(), "before": note.before, "at": time.time_ns()}
    if kind in _IN_PLACE:
        note.rewritten_at = _bump()
    if kind not in note.kinds:
        note.kinds.add(kind)
        line = line or {"path": path, "kind": kind, "pid": os.getpid()}
    if line is not None:
        _journal(line)


def skipped(path: str) -> bool:
    excluded = _excluded.get(path)
    if excluded is None:
        excluded = _excluded[path] = bool(_excludes(path)) if _excludes is not None else False
    if excluded:
        return True
    return bool(_temp) and (path in _temp or any(at in _temp for at in ancestors(path)))


def state_of(path: str) -> list | None:
    """[mode, size, mtime_ns, ino, digest of the last TAIL_BYTES] of what ``path`` names now
    (not following a last symlink), or None when nothing is there."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    return [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, tail_digest(path, st.st_size) if stat_.S_ISREG(st.st_mode) else None]


def tail_digest(path: str, size: int, fd: int = -1) -> str | None:
    """xxh3-128 of the ``TAIL_BYTES`` before ``size`` (None for an empty or unreadable file)."""
    if size <= 0:
        return None
    start = max(0, size - TAIL_BYTES)
    own = fd < 0
    try:
        if own:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        data = os.pread(fd, size - start, start)
    except OSError:
        return None
    finally:
        if own and fd >= 0:
            os.close(fd)
    return xxhash.xxh3_128_hexdigest(data) if len(data) == size - start else None


def _bump() -> int:
    value = struct.unpack_from("<Q", _counter)[0] + 1
    struct.pack_into("<Q", _counter, 0, value)
    return value


def _journal(record: dict) -> None:
    # One write of one line: O_APPEND keeps the lines of the trainee and its workers whole.
    os.write(_journal_fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def forget_gone_temps() -> None:
    """Drop the scratch paths that are gone (a program may make thousands)."""
    for path in [p for p in _temp if not os.path.lexists(p)]:
        _temp.discard(path)


def mark(snap_id: str) -> str:
    """Write snapshot ``snap_id``'s marker into the journal; read the workers' lines before it.
    Returns the marker's token, which the manifest names."""
    token = os.urandom(8).hex()
    _journal({"snapshot": snap_id, "token": token, "pid": os.getpid()})
    merge_journal()
    return token


def merge_journal() -> None:
    """Fold into ``notes`` what this process's forked children wrote into the journal since."""
    global _read_at
    try:
        end = os.fstat(_journal_fd).st_size
        data = os.pread(_journal_fd, end - _read_at, _read_at) if end > _read_at else b""
    except OSError:
        return
    whole = data.rfind(b"\n") + 1  # a child's line may be half-written right now
    _read_at += whole
    me = os.getpid()
    for line in data[:whole].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("pid") == me or "path" not in record:
            continue
        path, kind = record["path"], record.get("kind")
        note = notes.get(path)
        if note is None:
            note = notes[path] = Note(record.get("before"))
            note.made = note.before is None and kind in _MAKES
        if kind in _IN_PLACE:
            note.rewritten_at = rewrites()  # a worker logs its first rewrite only: count it as recent
        note.kinds.add(kind)


def adopt(path: str, made: bool, kind: str, child: bool = False, before: list | None = None) -> None:
    """Take over a path an earlier run wrote (a restart, from its snapshot's table); ``kind``
    as the table's: a directory the program made is searched at each snapshot, as it was, and
    a path named to a process the program started (``child``) stays one, unchanged since
    ``before`` where the table kept it by its length."""
    if path not in notes and not skipped(path):
        note = notes[path] = Note(before)
        note.made = made
        if kind == "dir":
            note.kinds.add("mkdir")
        if child:
            note.kinds.add("child")
