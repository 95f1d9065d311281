"""What a restart's plan does to the file system (``rollback.Plan.apply``): moving a path aside
into ``DIR/after-<id>/`` (across file systems by copying), writing a file's snapshot content
(as a new file, or into the file the program holds open), cutting a file back, and what the
program's own open files need then: their buffers flushed, their offsets moved to the new end.
"""

from __future__ import annotations

import errno
import os
import shutil

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


def open_fds():
    """(fd, path, flags) of this process's open files."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as info:
                flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
        except (OSError, ValueError):
            continue
        yield fd, target, flags


def open_paths() -> frozenset:
    return frozenset(target for _, target, _ in open_fds() if target.startswith("/"))


def flush_writers(paths: set) -> None:
    """Flush the program's Python file objects that write ``paths``: what the replayed setup
    left in their buffers reaches the file now, before it is put back, not after (a header
    written twice)."""
    fds = {fd for fd, target, flags in open_fds() if target in paths and flags & (os.O_WRONLY | os.O_RDWR)}
    if not fds:
        return
    import gc
    import io

    for obj in gc.get_objects():
        if isinstance(obj, (io.TextIOBase, io.BufferedIOBase)):
            try:
                if not obj.closed and obj.fileno() in fds:
                    obj.flush()
            except Exception:  # noqa: BLE001 - a detached or broken stream holds nothing to flush
                pass


def held(path: str, open_paths: frozenset) -> bool:
    return any(p == path or p.startswith(path + "/") for p in open_paths)


def seek_writers(path: str, length: int) -> None:
    """The program's descriptors that write ``path`` without appending go on at ``length``, where
    the file stood at the snapshot (a handler opened with mode ``w`` at setup)."""
    real = os.path.realpath(path)
    for fd, target, flags in list(open_fds()):
        if target == real and flags & (os.O_WRONLY | os.O_RDWR) and not flags & os.O_APPEND:
            try:
                os.lseek(fd, length, os.SEEK_SET)
            except OSError:
                pass
