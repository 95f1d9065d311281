"""Which paths are the program's files: normalizing what a call named, and leaving out the
excluded ones.

A path is made absolute against the working directory of the moment (or against the directory a
``dir_fd`` names) and its directories are resolved (``realpath`` of the parent), so that two
spellings of one file are one entry; the last component is resolved too when the call follows it
(``open`` writes a symlink's target, ``rename`` moves the link itself).

Exclusion patterns (``--files-exclude``, after the defaults): a pattern without ``/`` matches any
component's name (``__pycache__``, ``*.lock``); one with ``/`` matches the path or a directory
above it (``~/.cache``, ``./wandb``, ``/data/*/tmp``), relative ones against the run's working
directory; ``~`` and ``$VARIABLES`` are expanded, and a pattern naming an unset variable is
dropped. ``*`` crosses ``/`` (fnmatch), so ``/scratch/*`` excludes everything under /scratch.
"""

from __future__ import annotations

import fnmatch
import os
import re

# Caches a program fills and would fill again, which nobody expects a restart to roll back.
# Shown by `gpusnap run --help`; a user's patterns add to them.
DEFAULT_EXCLUDES = (
    "~/.cache",
    "$XDG_CACHE_HOME",
    "$HF_HOME",
    "$HF_DATASETS_CACHE",
    "$TRANSFORMERS_CACHE",
    "$TORCH_HOME",
    "$TORCHINDUCTOR_CACHE_DIR",
    "/tmp/torchinductor_*",
    "$TRITON_CACHE_DIR",
    "~/.triton",
    "/dev/shm",
    "__pycache__",
    "cache-*.arrow",  # datasets' map() caches beside a dataset saved with save_to_disk
)
# Never the program's files, whatever the patterns: devices and the kernel's views.
_SYSTEM = ("/dev", "/proc", "/sys")
_GLOB = frozenset("*?[")
_UNSET = re.compile(r"\$(\w+|\{[^}]*\})")


def expand(pattern: str, cwd: str) -> str | None:
    """A pattern with ``~`` and variables expanded and, if it names a path, made absolute; None
    when it names a variable that is not set."""
    expanded = os.path.expandvars(os.path.expanduser(pattern.strip()))
    if not expanded or _UNSET.search(expanded):
        return None  # expandvars leaves an unset variable as it was
    if "/" in expanded:
        expanded = os.path.normpath(os.path.join(cwd, expanded)) if not expanded.startswith("/") else os.path.normpath(expanded)
    return expanded


class Excludes:
    """``excluded(path)`` for absolute, normalized paths."""

    def __init__(self, patterns, cwd: str, always=()):
        names, prefixes, globs = [], [], []
        for pattern in [*patterns, *_SYSTEM, *always]:
            text = expand(pattern, cwd) if pattern else None
            if text is None:
                continue
            if "/" not in text:
                names.append(text)
            elif _GLOB.isdisjoint(text):
                prefixes.append(text.rstrip("/") or "/")
            else:
                globs.append(text)
        self.names, self.prefixes, self.globs = (tuple(dict.fromkeys(x)) for x in (names, prefixes, globs))

    def saved(self) -> dict:
        """The patterns as the manifest's file table keeps them (``rollback.excludes_of``)."""
        return {"names": list(self.names), "prefixes": list(self.prefixes), "globs": list(self.globs)}

    @classmethod
    def from_saved(cls, saved: dict) -> "Excludes":
        ex = cls((), "/")
        ex.names, ex.prefixes, ex.globs = (tuple(saved.get(k) or ()) for k in ("names", "prefixes", "globs"))
        return ex

    def __call__(self, path: str) -> bool:
        for prefix in self.prefixes:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return True
        if self.names:
            for part in path.split("/"):
                if part and any(fnmatch.fnmatchcase(part, name) for name in self.names):
                    return True
        for glob in self.globs:
            at = path
            while at not in ("/", ""):
                if fnmatch.fnmatchcase(at, glob):
                    return True
                at = os.path.dirname(at)
        return False


def normalize(raw, dir_fd=None, follow: bool = True) -> str | None:
    """The absolute path a call on ``raw`` reaches, or None for what is not a path (a file
    descriptor, an object that is not path-like)."""
    try:
        path = os.fsdecode(os.fspath(raw))
    except TypeError:
        return None
    if not path:
        return None
    if not path.startswith("/"):
        base = os.getcwd() if dir_fd is None or dir_fd < 0 else fd_path(dir_fd)
        if base is None:
            return None
        path = os.path.join(base, path)
    if follow:
        return os.path.realpath(path)
    parent, name = os.path.split(os.path.normpath(path))
    return os.path.join(os.path.realpath(parent), name) if name else os.path.realpath(parent)


def ancestors(path: str):
    """The directories above ``path``, nearest first, the root left out."""
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent):
        yield parent
        parent = os.path.dirname(parent)


def fd_path(fd: int) -> str | None:
    """The path an open file descriptor of this process names (None: not a file, or gone)."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return target if target.startswith("/") and not target.endswith(" (deleted)") else None


def relative_name(path: str) -> str:
    """Where ``path`` goes under a directory that mirrors the file system (``after-<id>/``)."""
    return path.lstrip("/")
