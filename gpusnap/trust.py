"""What gpusnap trusts on disk: a run directory and the code cache are code (restart unpickles a
snapshot, imports the modules it names and runs the command ``run.json`` records; the cache
holds compiled code), so each file and directory of them must be the user's own and writable by
nobody else, and no symbolic link may lead out of them. ``torch.load`` warns the same way about
untrusted files; ``gpusnap export`` writes weights as safetensors, which hold no code.

The floor of the package (as ``errors`` and ``knobs``): the store, the launcher and the
instrumentation's cache all ask it.
"""

from __future__ import annotations

import os
import stat

from gpusnap import knobs

TRUST_HINT = ("restoring a snapshot runs the code it names: use a run directory only you can write (chown it to "
              "yourself, chmod go-w), or pass --trust-dir if everyone who can write to it may run code as you")


def untrusted(st: os.stat_result, *, plain_file: bool = False) -> str | None:
    """Why a file or directory of a run directory (or of gpusnap's code cache) cannot be
    trusted, or None: it is another user's, others can write to it, it is a symbolic link, or
    (``plain_file``) it is no plain file or has other hard links (the path of a file someone
    else owns, linked in). ``GPUSNAP_TRUST_DIR=1`` (--trust-dir) waives owner and mode."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if plain_file and (not stat.S_ISREG(st.st_mode) or st.st_nlink != 1):
        return "is not a plain file of its own" if stat.S_ISREG(st.st_mode) else "is not a plain file"
    if knobs.TRUST_DIR:
        return None
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
