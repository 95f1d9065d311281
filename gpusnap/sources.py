"""Whose code a source file is: the standard library's, an installed package's (site-packages,
dist-packages), gpusnap's own, or the program's. The import hook instruments the program's
modules only (``instrument.importer``), and the file watch keeps what ``tempfile`` makes for the
program's code but not for a library's (``files.watch``), and so are the calls the program
registers with ``atexit`` (``graph.exits``): one rule for all three."""

from __future__ import annotations

import functools
import os

_PACKAGE_DIRS = ("site-packages", "dist-packages")


def real(path: str) -> str:
    """``path`` with every symbolic link resolved. Asked of every module the program imports
    (thousands with a framework), so each directory is resolved once, and the file itself
    costs one lstat unless it is a link."""
    if os.path.islink(path):
        return os.path.normcase(os.path.realpath(path))
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(_real_dir(head), os.path.normcase(tail))


@functools.lru_cache(maxsize=None)
def _real_dir(directory: str) -> str:
    return os.path.normcase(os.path.realpath(directory))


def under(path: str, prefixes: tuple[str, ...]) -> bool:
    for prefix in prefixes:
        if path == prefix or path.startswith(prefix if prefix.endswith(os.sep) else prefix + os.sep):
            return True
    return False


# The standard library's directory and gpusnap's package.
LIBRARY_DIRS = (real(os.path.dirname(os.__file__)), real(os.path.dirname(__file__)))


def library_file(real_path: str) -> bool:
    """Whether the file ``real_path`` (``real()``'s) is a library's rather than the program's."""
    return under(real_path, LIBRARY_DIRS) or any(part in real_path.split(os.sep) for part in _PACKAGE_DIRS)


def library_code(filename: str) -> bool:
    """Whether code compiled from ``filename`` (a frame's ``co_filename``) is a library's: a file
    ``library_file`` names, or code with no file (``<string>``, ``<frozen ...>``). Asked of the
    caller of ``tempfile`` (``files.watch``) and of ``atexit.register`` (``graph.exits``)."""
    return filename.startswith("<") or library_file(real(filename))
