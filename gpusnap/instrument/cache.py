"""On-disk cache of instrumented code objects, so a restart does not re-transform every module.

An entry is named by a hash of (file path, source hash, transform version, Python version,
optimize level): ``co_filename`` is baked into a code object, so the path is part of the key.
Entries live under ``knobs.CACHE_DIR`` (never in the user's ``__pycache__``, which a later plain
``python`` run would load). A file is ``MAGIC``, an 8-byte little-endian xxh3-64 of the payload,
then ``marshal`` of the code object; a torn or foreign file fails the check and is recompiled.
Writes go to a temporary name in the same directory and are renamed into place, so readers see
an old entry, a new entry or none. No fsync: a lost entry only costs a recompile.
Every failure here degrades to "not cached"; the cache never stops a program.
"""

from __future__ import annotations

import marshal
import os
import sys

import xxhash

from gpusnap import knobs

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


def load(entry_key: str):
    directory = cache_dir()
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, entry_key[:2], entry_key), "rb") as f:
            blob = f.read()
    except OSError:
        return None
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
    tmp = os.path.join(subdir, f".{entry_key}.{os.getpid()}.tmp")
    try:
        os.makedirs(subdir, mode=0o700, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, os.path.join(subdir, entry_key))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
