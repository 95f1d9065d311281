"""What a restart's plan does to the file system (``rollback.Plan.apply``): moving a path aside
into ``DIR/after-<id>/`` (across file systems by copying), writing a file's snapshot content
(as a new file, or into the file the program holds open), cutting a file back, and what the
program's own open files need then: their buffers flushed (at each snapshot too), their offsets
moved to the new end.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import weakref

from gpusnap.files import guard
from gpusnap.files.paths import relative_name


def aside_path(path: str, after_dir: str) -> str:
    to = os.path.join(after_dir, relative_name(path))
    n = 1
    while os.path.lexists(to):
        n += 1
        to = os.path.join(after_dir, relative_name(path) + f".{n}")
    return to


def move_aside(path: str, after_dir: str) -> str | None:
    guard.keep(path, "moved")  # a verify puts it back afterwards
    if not os.path.lexists(path):
        return None
    to = aside_path(path, after_dir)
    make_parent(to, after_dir)
    try:
        os.rename(path, to)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # Another file system than the run directory's: copy, then remove the original.
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.copytree(path, to, symlinks=True)
            shutil.rmtree(path)
        else:
            shutil.copy2(path, to, follow_symlinks=False)
            os.unlink(path)
    return to


def make_dir(path: str, mode: int) -> None:
    guard.keep(path, "mkdir")  # a verify puts it back afterwards
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)


def cut(path: str, length: int, in_place: bool) -> None:
    guard.keep(path, "rewrite")  # a verify puts it back afterwards
    os.truncate(path, length)
    if in_place:
        seek_writers(path, length)


def link(path: str, target: str) -> None:
    guard.keep(path, "replaced")  # a verify puts it back afterwards
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def copy_aside(path: str, after_dir: str) -> str:
    to = aside_path(path, after_dir)
    make_parent(to, after_dir)
    shutil.copy2(path, to)
    return to


def make_parent(to: str, after_dir: str) -> None:
    if not os.path.isdir(after_dir):
        os.makedirs(after_dir, exist_ok=True)
        os.chmod(after_dir, 0o700)  # beside the snapshots, as private as they are
    os.makedirs(os.path.dirname(to), exist_ok=True)


def write_new(path: str, data, mode: int) -> None:
    from gpusnap import atomic

    guard.keep(path, "write")  # a verify puts it back afterwards
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic.write_file(path, [data], mode=mode)


def write_in_place(path: str, data, mode: int) -> None:
    guard.keep(path, "rewrite")  # a verify puts it back afterwards
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        at = 0
        while at < len(view):
            at += os.pwrite(fd, view[at:], at)
        os.ftruncate(fd, len(view))
        os.fsync(fd)
    finally:
        os.close(fd)
    seek_writers(path, len(data))


def _targets():
    """(fd, path) of this process's open descriptors."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            yield int(name), os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue


def writing_fds(paths) -> dict[int, tuple[str, int]]:
    """{fd: (path, flags)} of this process's descriptors open for writing on one of ``paths``. Only
    theirs have their flags read: a snapshot's stall asks, where a program with DataLoader
    workers holds hundreds of pipes."""
    found = {}
    for fd, target in _targets():
        if target in paths:
            try:
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                found[fd] = (target, flags)
    return found


def open_paths() -> frozenset:
    return frozenset(target for _, target in _targets() if target.startswith("/"))


# Python's own buffered files over a file descriptor: a flush moves their bytes to the file and
# changes none. Not a subclass, nor text over one: a gzip.GzipFile's flush adds a sync point to
# what it compresses, so the file would differ from an uninterrupted run's (the BufferedWriter
# under it is flushed, as any other).
_BUFFERED = (io.BufferedWriter, io.BufferedRandom)
_writers_of: dict[int, list] = {}  # fd -> weak references to the buffered files found over it
_unbuffered: set[tuple[int, str]] = set()  # (fd, path) found with none: a native writer's
_places: dict[int, tuple[str, int]] = {}  # fd -> (path, offset) of each writing descriptor at the last flush


def flush_writers(paths) -> None:
    """Flush the program's buffered Python files that write ``paths``. At a snapshot, so that the
    file holds every line the program wrote before it: a metrics file written a line per step,
    never flushed by hand, restarted "verified" without the lines its buffer held
    (``tests/programs/corpus/buffered_log.py``, 3 of 3). At the merge, so that what the replayed
    setup left in a buffer reaches the file before it is put back, not after (a header written
    twice). The heap is scanned for them only where a descriptor is new to this search."""
    fds = {fd: target for fd, (target, _) in writing_fds(paths).items()}
    if any(not _open_writers(fd) and (fd, target) not in _unbuffered for fd, target in fds.items()):
        _find_writers(fds)
    _places.clear()
    for fd, target in fds.items():
        for obj in _open_writers(fd):
            try:
                obj.flush()
            except Exception:  # noqa: BLE001 - a broken stream: the program meets its error itself
                pass
        try:
            _places[fd] = (target, os.lseek(fd, 0, os.SEEK_CUR))
        except OSError:
            pass


def reopen_state(obj) -> dict | None:
    """How to open again a plain Python file (``open()``'s) the program writes through, as the
    last flush (the stall's, before the fork) found it: its path, mode, offset and text settings.
    None for any other file. A restart opens such a file again where the replay, which skipped
    the step that opened it, holds none (a CSV logger made at its first record)."""
    if not _plain(obj) or obj.closed:
        return None
    place = _places.get(_fileno(obj))
    if place is None:
        return None
    text = type(obj) is io.TextIOWrapper
    state = {"path": place[0], "offset": place[1], "mode": (obj.buffer if text else obj).raw.mode, "text": text}
    if text:
        state.update(encoding=obj.encoding, errors=obj.errors, line_buffering=obj.line_buffering, write_through=obj.write_through)
    return state


def _open_writers(fd: int) -> list:
    found = [obj for ref in _writers_of.get(fd, ()) if (obj := ref()) is not None and not obj.closed and _fileno(obj) == fd]
    if not found:
        _writers_of.pop(fd, None)
    return found


def _find_writers(fds: dict) -> None:
    import gc

    for obj in gc.get_objects():
        if _plain(obj) and not obj.closed and (fd := _fileno(obj)) in fds:
            _writers_of.setdefault(fd, []).append(weakref.ref(obj))
    _unbuffered.update((fd, target) for fd, target in fds.items() if fd not in _writers_of)


def _plain(obj) -> bool:
    try:
        if type(obj) is io.TextIOWrapper:
            obj = obj.buffer
        return type(obj) in _BUFFERED and type(obj.raw) is io.FileIO
    except Exception:  # noqa: BLE001 - detached
        return False


def _fileno(obj) -> int:
    try:
        return obj.fileno()
    except Exception:  # noqa: BLE001 - detached, or over no descriptor
        return -1


def held(path: str, open_paths: frozenset) -> bool:
    return any(p == path or p.startswith(path + "/") for p in open_paths)


def seek_writers(path: str, length: int) -> None:
    """The program's descriptors that write ``path`` without appending go on at ``length``, where
    the file stood at the snapshot (a handler opened with mode ``w`` at setup)."""
    for fd, (_, flags) in writing_fds({os.path.realpath(path)}).items():
        if not flags & os.O_APPEND:
            try:
                os.lseek(fd, length, os.SEEK_SET)
            except OSError:
                pass
