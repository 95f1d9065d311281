"""On-disk cache of instrumented code objects, so a restart does not re-transform every module.

An entry is named by a hash of (file path, source hash, transform version, Python version,
optimize level): ``co_filename`` is baked into a code object, so the path is part of the key.
Entries live under ``knobs.CACHE_DIR`` (never in the user's ``__pycache__``, which a later plain
``python`` run would load). A file is ``MAGIC``, an 8-byte little-endian xxh3-64 of the payload,
then ``marshal`` of the code object; a torn or foreign file fails the check and is recompiled.
Writes go to a temporary name in the same directory and are renamed into place, so readers see
an old entry, a new entry or none. No fsync: a lost entry only costs a recompile.
Every failure here degrades to "not cached"; the cache never stops a program.

A cached entry is code the trainee runs, so the cache is trusted as a run directory is
(``gpusnap.trust``): an entry is loaded, and written, only where the cache's directories
and the entry are the user's own, writable by nobody else and no symbolic link; otherwise the
module is compiled afresh (and one line says why, once).
"""

from __future__ import annotations

import marshal
import os
import sys

import xxhash

from gpusnap import atomic, knobs
from gpusnap.errors import GpusnapError
from gpusnap.trust import untrusted

MAGIC = b"GSNPCODE1\n"
_disabled = knobs.CACHE_DIR.strip().lower() in ("off", "0", "none", "false")


def cache_dir() -> str | None:
    if _disabled:
        return None
    base = knobs.CACHE_DIR
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "gpusnap")
    return os.path.join(base, "code")


def key(path: str, source_digest: str, transform_version: int) -> str:
    parts = (path, source_digest, str(transform_version), sys.version, str(sys.flags.optimize))
    return xxhash.xxh3_128_hexdigest("\0".join(parts).encode("utf-8", "surrogatepass"))


_refused: set[str] = set()  # directories already said to be untrusted


def _trusted(*paths: str) -> bool:
    """Whether each of ``paths`` (that exists) is the user's own and private; says once why not."""
    for path in paths:
        try:
            why = untrusted(os.lstat(path))
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if why is not None:
            if path not in _refused:
                _refused.add(path)
                print(f"gpusnap: not using the code cache {path}: it {why}", file=sys.stderr)
            return False
    return True


def _chain(entry_key: str) -> tuple[str, ...]:
    """The cache's directories, outermost first, then the entry's subdirectory."""
    directory = cache_dir()
    return (os.path.dirname(directory), directory, os.path.join(directory, entry_key[:2]))


def load(entry_key: str):
    directory = cache_dir()
    if directory is None or not _trusted(*_chain(entry_key)):
        return None
    try:
        fd = os.open(os.path.join(directory, entry_key[:2], entry_key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if untrusted(os.fstat(fd), plain_file=True) is not None:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            blob = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    head = len(MAGIC)
    if blob[:head] != MAGIC or len(blob) < head + 8:
        return None
    payload = blob[head + 8 :]
    if int.from_bytes(blob[head : head + 8], "little") != xxhash.xxh3_64_intdigest(payload):
        return None
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None


def store(entry_key: str, code) -> None:
    directory = cache_dir()
    if directory is None:
        return
    payload = marshal.dumps(code)
    blob = MAGIC + xxhash.xxh3_64_intdigest(payload).to_bytes(8, "little") + payload
    subdir = os.path.join(directory, entry_key[:2])
    try:
        os.makedirs(subdir, mode=0o700, exist_ok=True)
        if not _trusted(*_chain(entry_key)):
            return
        # Not durable: a torn or lost entry fails its digest on load and is compiled again.
        atomic.write_file(os.path.join(subdir, entry_key), [blob], durable=False)
    except (OSError, GpusnapError):
        pass  # no cache entry: the next run compiles the module again
