"""Where a run directory lives, from what the user typed after ``--dir`` or as ``DIR``.

Every command that takes a run directory turns its argument into a location here and nowhere
else, so that a URL is never taken for a relative path (``s3://b/p`` once became the local
directory ``./s3:/b/p``, which vanished with the machine it was on). A URL of an object store
(``s3://``, ``gs://``, ``az://``: ``store.objects``) names the shared level of the run; its
local level is ``store.levels.cache_dir(url)``.
"""

from __future__ import annotations

import os

from gpusnap.errors import UsageError

URL_HINT = ("pass a local directory, or one on a shared filesystem (NFS, Lustre) that the next "
            "machine mounts at the same place, or s3://BUCKET/PREFIX (also gs://, az://)")


def scheme_of(text: str) -> str | None:
    """``s3`` for ``s3://bucket/prefix``; None for a path. Anything with ``://`` is a URL."""
    head, sep, _ = text.partition("://")
    return head.lower() if sep else None


def resolve(text: str) -> tuple[str, str | None]:
    """(absolute local path, the store's URL or None). For a URL the path is its local level.
    UsageError (exit 2) for a URL of a store gpusnap cannot write to."""
    from gpusnap.store.objects import SCHEMES

    scheme = scheme_of(text)
    if scheme is None:
        return os.path.abspath(text), None
    bucket = text.split("://", 1)[1].split("/", 1)[0]
    if scheme not in SCHEMES or not bucket:
        raise UsageError(f"{text} is a URL, and run directories on {scheme or '?'}:// are not supported",
                         hint=URL_HINT)
    from gpusnap.store.levels import cache_dir

    url = f"{scheme}://{text.split('://', 1)[1].strip('/')}"
    return str(cache_dir(url)), url


def local_dir(text: str) -> str:
    """The absolute path of a run directory that must be local (or its local level)."""
    return resolve(text)[0]


def open_shared(url: str):
    """The RunDir of the shared level of ``url`` (reads and writes go to the store)."""
    from gpusnap.store.objects import open_backend
    from gpusnap.store.rundir import RunDir

    return RunDir.open(url, backend=open_backend(url))


def probe(url: str) -> None:
    """Reach the store before anything is created locally: a missing bucket, missing or wrong
    credentials are one line and a hint here, not after the program started."""
    from gpusnap.store.objects import open_backend

    try:
        open_backend(url).list("")
    except FileNotFoundError:
        pass  # an empty prefix: a new run directory
