"""The one way a final file comes into being, and the one way it goes.

``write_file`` writes under a temporary name in the final directory, checks the length, fsyncs,
renames onto the final name and fsyncs the directory (restic ``local.Save``). No other code opens
a final path for writing. A crash at any moment leaves either no final file or a complete one,
plus at worst a temporary file that ``gc`` removes.

A manifest is committed with ``noreplace``: renamed with ``renameat2(RENAME_NOREPLACE)`` (or,
where the file system lacks it, linked and the temporary name unlinked), so that two writers that
both believe they hold a run directory can never replace each other's committed manifest.

``open_private`` opens the files gpusnap keeps open in a run directory (the lock, the run log):
never through a symbolic link, and only a plain file of the user's own that nobody else can
write (the run directory is trusted data: ``gpusnap.trust``).

The floor of the package (as ``errors`` and ``knobs``): the store writes every file of a run
directory through it, and gpusnap's files outside one (the code cache, a DataLoader worker's
states, a file a verify puts back) through it too.

The OS calls go through the module-level names below so that tests can inject ENOSPC or EIO by
swapping one of them (``atomic._write = failing_write``) without patching the OS.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import pathlib
import secrets

from gpusnap.errors import NoSpace, RunDirPermission, StoreError
from gpusnap.trust import TRUST_HINT, untrusted

_open = os.open
_write = os.write
_fsync = os.fsync
_rename = os.rename
_unlink = os.unlink
_close = os.close
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)  # glibc >= 2.28

# A temporary file is "<final name>.tmp-<pid>-<8 hex>": gc can tell it from a final file and,
# from the pid, whether the writer that left it is gone.
TMP_MARK = ".tmp-"

# os.write on Linux moves at most 0x7ffff000 bytes per call; larger buffers (> 2 GiB) loop.
_MAX_WRITE = 1 << 30


def is_temp(name: str) -> bool:
    return TMP_MARK in name


def _temp_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def temp_pid(name: str) -> int | None:
    try:
        return int(name.rsplit(TMP_MARK, 1)[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _raise_for(exc: OSError, path: pathlib.Path, what: str) -> None:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        raise NoSpace(f"no space left on device while writing {path}") from exc
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        raise RunDirPermission(
            f"cannot write {path}: {exc.strerror}",
            hint="make the run directory writable, or pass another --dir",
        ) from exc
    raise StoreError(f"{what} {path} failed: {exc.strerror or exc}") from exc


def fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def write_file(path: pathlib.Path, parts, mode: int = 0o600, *, direct: bool = False, noreplace: bool = False,
               durable: bool = True) -> int:
    """Write ``parts`` (an iterable of bytes-like objects) to ``path`` atomically; return the
    number of bytes written. Raises NoSpace, RunDirPermission or StoreError, leaving no
    temporary file behind when it can.

    ``noreplace``: the final name must not exist (a committed manifest): FileExists when it
    does, decided by the rename itself, not by a check before it that another writer could
    slip past.

    ``direct``: when ``parts`` is one writable, page-aligned buffer, its whole blocks go to the
    disk with O_DIRECT (no copy into the page cache) and only the tail is buffered. A file
    system that refuses O_DIRECT (tmpfs, some network mounts) gets ordinary writes.

    ``durable=False``: no fsync of the file or its directory, for a file that is whole or absent
    but need not outlive a crash of the host (a cache entry checked on read, a file in
    /dev/shm)."""
    path = pathlib.Path(path)
    parts = list(parts)
    tmp = _temp_path(path)
    expected = 0
    fd = -1
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        direct_part = _direct_candidate(parts) if direct else None
        fd = _open_maybe_direct(tmp, flags, mode, direct_part is not None)
        for part in parts:
            view = memoryview(part).cast("B")
            expected += len(view)
            if part is direct_part:
                _write_direct(fd, view)
            else:
                _write_all(fd, view)
        size = os.fstat(fd).st_size
        if size != expected:
            raise OSError(errno.EIO, f"length check: wrote {size} bytes, expected {expected}")
        if durable:
            _fsync(fd)
        _close(fd)
        fd = -1
        if noreplace:
            _rename_noreplace(tmp, path)
        else:
            _rename(tmp, path)
    except OSError as exc:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if noreplace and exc.errno == errno.EEXIST:
            raise FileExists(f"{path} exists already: a committed file is never replaced") from exc
        _raise_for(exc, path, "write of")
    if not durable:
        return expected
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        _raise_for(exc, path.parent, "fsync of directory")
    return expected


class FileExists(StoreError):
    """``write_file(noreplace=True)`` found its final name taken."""


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _rename_noreplace(src: pathlib.Path, dst: pathlib.Path) -> None:
    """rename(2) that fails with EEXIST instead of replacing ``dst``. A file system without
    renameat2's flags (EINVAL) gets link(2), which never replaces either, then the unlink of
    the temporary name."""
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    os.link(src, dst)
    os.unlink(src)


# O_DIRECT needs block-aligned memory, lengths and file offsets; a page covers every common
# logical block size.
_BLOCK = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


# statfs(2)'s f_type of the file systems that live in memory: tmpfs, ramfs.
_MEMORY_FS = {0x01021994, 0x858458F6}


def copies_writes(directory: pathlib.Path) -> bool:
    """Whether every write to a file in ``directory`` copies its bytes into the page cache,
    whatever it asks for: a file system in memory (tmpfs takes O_DIRECT since Linux 6.6, and
    copies all the same) or one that refuses O_DIRECT."""
    return _fs_type(directory) in _MEMORY_FS or not takes_direct(directory)


def _fs_type(directory: pathlib.Path) -> int | None:
    buf = ctypes.create_string_buffer(256)  # struct statfs (120 bytes on 64-bit Linux); f_type first
    if _libc.statfs(os.fsencode(directory), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def takes_direct(directory: pathlib.Path) -> bool:
    """Whether files in ``directory`` take O_DIRECT writes (tmpfs and some network mounts refuse
    them, at open or at the first write): one aligned block written to a temporary file there."""
    if not _O_DIRECT:
        return False
    probe = _temp_path(pathlib.Path(directory, "direct-probe"))
    block = mmap.mmap(-1, _BLOCK)
    try:
        # os.*, not the swappable _open/_write: a test's injected fault counts the writer's own calls
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | _O_DIRECT, 0o600)
        try:
            os.write(fd, block)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        _raise_for(exc, probe, "write of")
    finally:
        block.close()
    return True


def _direct_candidate(parts):
    if not _O_DIRECT or len(parts) != 1:
        return None
    part = parts[0]
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(part))
    except (TypeError, ValueError):  # read-only or not a plain buffer
        return None
    return part if address % _BLOCK == 0 and memoryview(part).nbytes >= _BLOCK else None


def _open_maybe_direct(tmp: pathlib.Path, flags: int, mode: int, direct: bool) -> int:
    if direct:
        try:
            return _open(tmp, flags | _O_DIRECT, mode)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return _open(tmp, flags, mode)


def _write_direct(fd: int, view: memoryview) -> None:
    whole = len(view) // _BLOCK * _BLOCK
    try:
        _write_all(fd, view[:whole])
    except OSError as exc:
        if exc.errno != errno.EINVAL or os.lseek(fd, 0, os.SEEK_CUR) != 0:
            raise
        whole = 0  # O_DIRECT accepted at open, refused at write: write it all buffered
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
    _write_all(fd, view[whole:])


def _write_all(fd: int, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        n = _write(fd, view[pos : pos + _MAX_WRITE])
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        pos += n


def remove_file(path: pathlib.Path, *, missing_ok: bool = True) -> None:
    """Remove a final file; the caller fsyncs the directory once after a batch of removals."""
    try:
        _unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
    except OSError as exc:
        _raise_for(exc, pathlib.Path(path), "removal of")


def make_dir(path: pathlib.Path, mode: int = 0o700) -> None:
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
    except OSError as exc:
        _raise_for(exc, pathlib.Path(path), "creation of directory")


def open_private(path: pathlib.Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a file gpusnap keeps in a run directory (the lock, the run log), never
    through a symbolic link (O_NOFOLLOW), refused (RunDirPermission) unless ``untrusted`` finds
    nothing wrong with what it opened. Other OSErrors pass through."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunDirPermission(f"{path} is a symbolic link: gpusnap never follows one in a run directory",
                                   hint=f"remove it (rm {path}); something other than gpusnap put it there") from None
        raise
    why = untrusted(os.fstat(fd), plain_file=True)
    if why is not None:
        os.close(fd)
        raise RunDirPermission(f"{path} {why}", hint=TRUST_HINT)
    return fd
