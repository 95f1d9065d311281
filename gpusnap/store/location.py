"""Where a run directory lives, from what the user typed after ``--dir`` or as ``DIR``.

Every command that takes a run directory turns its argument into a location here and nowhere
else, so that a URL is never taken for a relative path (``s3://b/p`` once became the local
directory ``./s3:/b/p``, which vanished with the machine it was on).
"""

from __future__ import annotations

import os

from gpusnap.errors import UsageError

URL_HINT = ("pass a local directory, or one on a shared filesystem (NFS, Lustre) that the next "
            "machine mounts at the same place")


def scheme_of(text: str) -> str | None:
    """``s3`` for ``s3://bucket/prefix``; None for a path. Anything with ``://`` is a URL."""
    head, sep, _ = text.partition("://")
    return head.lower() if sep else None


def local_dir(text: str) -> str:
    """The absolute path of a local run directory, or UsageError (exit 2) for a URL of a store
    gpusnap cannot write to."""
    scheme = scheme_of(text)
    if scheme is not None:
        raise UsageError(f"{text} is a URL, and run directories on {scheme or '?'}:// are not supported",
                         hint=URL_HINT)
    return os.path.abspath(text)
