"""One writer per run directory.

The lock is the file ``lock`` holding {host, pid, time, purpose, token} as JSON, plus an
exclusive ``flock`` on it. The kernel drops the flock when its process dies, so a lock whose
holder is gone is stale and simply taken over; the JSON is what the message to the user shows.
The lock file descriptor is close-on-exec, so a program started by the holder does not inherit
it, and a process the holder forks (a DataLoader worker, the snapshot's writer) closes its copy
first thing: a flock belongs to the open file, which fork shares, and the workers of a rank
killed -9 held its shard's lock until they noticed their parent was gone (seconds), while a
restart was refused, naming the dead rank. The file is opened without following a symbolic
link, and only when it is a plain file of the user's own (``atomic.open_private``): a ``lock`` linked to another file must not make gc
write into that file.

Where flock does not reach another host (some network file systems), two hosts could both
"hold" the lock. Three things keep that from costing a snapshot:

- the holder refreshes the file's mtime every ``knobs.LOCK_REFRESH_S`` (a thread of its own), and
  a lock whose record names another host is taken over only once it has gone unrefreshed for
  ``knobs.LOCK_STALE_S``; before that it is reported as held (``RunDirLocked``);
- the record carries a random ``token``, which every writer checks again just before it commits
  a manifest (``check_token``): a writer whose holder lost the lock to another commits nothing;
- manifests are committed with ``noreplace`` (``atomic.write_file``), so no committed manifest is
  ever replaced, whoever writes.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import pathlib
import secrets
import socket
import threading
import time
import weakref

from gpusnap import knobs
from gpusnap.errors import RunDirError, RunDirLocked, RunDirPermission
from gpusnap import atomic

LOCK_NAME = "lock"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# The OS calls that can fail for reasons a test cannot cause for real (ENOLCK needs an NFS mount
# without a lock daemon): tests swap them, as in gpusnap/atomic.py.
_open = atomic.open_private
_flock = fcntl.flock
_pwrite = os.pwrite


def _refusal(exc: OSError, root: pathlib.Path) -> RunDirError:
    """One line for a lock that cannot be taken for a reason other than another holder."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RunDirPermission(
            f"cannot lock {root}: {why}",
            hint="a run directory must be writable: make it so, or use one on a writable file system",
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return RunDirError(
            f"cannot lock {root}: the directory is gone ({why})",
            hint="it was removed or unmounted meanwhile; check the path and run the command again",
        )
    if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
        return RunDirError(
            f"cannot lock {root}: its file system does not support file locks ({why})",
            hint="put the run directory on a local disk, or on a mount with locking enabled (NFS: not 'nolock')",
        )
    return RunDirError(f"cannot lock {root}: {why}", hint="check the run directory's disk (dmesg); earlier snapshots are untouched")


def read_holder(path: pathlib.Path) -> dict:
    """The record in a lock file ({} when it is empty or unreadable), read without following a
    symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        record = json.loads(os.read(fd, 1 << 16) or b"{}")
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else {}


def describe(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('time', '?')} "
            f"({holder.get('purpose', '?')})")


def check_token(root: pathlib.Path, token: str | None) -> None:
    """Before a commit: RunDirLocked unless the lock of ``root`` is still the one whose record
    carries ``token`` (None: the caller holds no lock of a run, as in tests: nothing to check).
    An empty record is no evidence against us (a full disk kept the holder from writing it)."""
    if token is None:
        return
    path = root / LOCK_NAME
    if not path.exists() and not path.is_symlink():
        raise RunDirLocked(f"{root}'s lock is gone: something removed it while this run held it, so another "
                           "process may be writing here; this snapshot is not committed",
                           hint="stop the other process (or this one) and restart; earlier snapshots are intact")
    holder = read_holder(path)
    if holder and holder.get("token") != token:
        raise RunDirLocked(f"{root} was taken over by {describe(holder)} while this run held it; this snapshot is "
                           "not committed", hint="two processes write to one run directory: stop one of them; "
                           "earlier snapshots are intact")


_held: weakref.WeakSet = weakref.WeakSet()  # the locks this process holds


def _let_go_in_child() -> None:
    """In a forked child: close the copies of the parent's lock descriptors, and hold nothing
    (a ``release`` there would unlock the parent's)."""
    for lock in list(_held):
        if lock._fd >= 0:
            try:
                os.close(lock._fd)
            except OSError:
                pass
            lock._fd = -1
    _held.clear()


os.register_at_fork(after_in_child=_let_go_in_child)


class RunLock:
    """Held from acquire until release(); usable as a context manager."""

    def __init__(self, root: pathlib.Path, purpose: str) -> None:
        self.path = root / LOCK_NAME
        self.purpose = purpose
        self._fd = -1
        self.took_over: dict | None = None  # the stale holder's record, if there was one
        self.token = secrets.token_hex(16)
        self._record = b""
        self._written = False  # the record is in the file (a full disk may delay it)
        self._stop = threading.Event()
        self._mutex = threading.Lock()  # release() never closes the fd under a refresh

    def acquire(self) -> "RunLock":
        try:
            self._acquire()
        except OSError as exc:
            raise _refusal(exc, self.path.parent) from exc
        # A daemon thread: it refreshes the lock while the holder lives, and ends with it.
        threading.Thread(target=self._refresh, name="gpusnap-lock", daemon=True).start()
        return self

    def _acquire(self) -> None:
        while True:
            fd = _open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirLocked(f"{self.path.parent} is used by {describe(read_holder(self.path))}") from None
            except OSError:
                os.close(fd)
                raise
            # The holder may have released (and unlinked) the file between our open and our
            # flock; then we hold a lock on a dead inode and must start over.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        try:
            previous = read_holder(self.path)
            if previous.get("host") not in (None, socket.gethostname()):
                silent_s = time.time() - os.fstat(fd).st_mtime
                if silent_s < knobs.LOCK_STALE_S:
                    raise RunDirLocked(
                        f"{self.path.parent} is used by {describe(previous)}: its lock was refreshed {silent_s:.0f} s ago, "
                        "and from this host gpusnap cannot see whether that process still runs",
                        hint=f"if it is gone, run this again once its lock has been silent for {knobs.LOCK_STALE_S:g} s, "
                             f"or remove {self.path}")
            if previous:
                self.took_over = previous
            record = {"host": socket.gethostname(), "pid": os.getpid(), "time": _now(), "purpose": self.purpose,
                      "token": self.token}
            self._record = json.dumps(record).encode() + b"\n"
            self._fd = fd
            _held.add(self)
            self._write_record()
        except BaseException:
            self._fd = -1
            _held.discard(self)
            os.close(fd)  # closing drops the flock
            raise

    def _write_record(self) -> None:
        """The record, or on a full disk nothing yet (the lock is the flock; the record says who
        holds it, and ``_refresh`` writes it once there is room)."""
        try:
            os.ftruncate(self._fd, 0)
            if _pwrite(self._fd, self._record, 0) != len(self._record):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(self._fd)
            self._written = True
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os.ftruncate(self._fd, 0)

    def _refresh(self) -> None:
        while not self._stop.wait(knobs.LOCK_REFRESH_S):
            with self._mutex:
                if self._fd < 0:
                    return
                try:
                    if not self._written:
                        self._write_record()
                    os.utime(self._fd)
                except OSError:
                    pass  # the next refresh tries again; a lock is never given up by its holder

    def note(self) -> str | None:
        """A line for the user when this lock was taken over from another host (where gpusnap
        could not see that its holder is gone, only that it stopped refreshing the lock)."""
        if self.took_over is None or self.took_over.get("host") in (None, socket.gethostname()):
            return None
        return (f"took over {self.path.parent}'s lock from {describe(self.took_over)}, which had not refreshed it "
                f"for {knobs.LOCK_STALE_S:g} s")

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        self._stop.set()
        with self._mutex:
            if self._fd < 0:
                return
            try:
                os.unlink(self.path)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
            _held.discard(self)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
