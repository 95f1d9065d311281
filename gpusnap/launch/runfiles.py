"""The files a supervisor keeps in its run directory (docs/FORMAT.md): ``supervisor.json``
(``supervisor-HOST.json`` for each node of a distributed run) says where it listens for `gpusnap
snap`, and ``log.jsonl`` is the run log, one JSON object a line. Both live on the run's local
level (an object store's run is staged on the local disk first) and go through the store's
interface (``store.local.LocalBackend``) like every other file of a run directory."""

from __future__ import annotations

import json
import os
import socket
import time

from gpusnap import lifeline
from gpusnap.errors import GpusnapError
from gpusnap.store.local import LocalBackend

SUPERVISOR_FILE = "supervisor.json"
LOG_FILE = "log.jsonl"


def supervisor_file(distributed: bool) -> str:
    """The key under which a supervisor says where it listens. The nodes of a distributed run
    share the run directory, and a unix socket answers only on its own host: one file per host."""
    return f"supervisor-{socket.gethostname()}.json" if distributed else SUPERVISOR_FILE


def read_supervisor(run_dir: str, key: str) -> dict | None:
    """What supervisor file ``key`` says; None when there is none or it does not parse."""
    try:
        info = json.loads(LocalBackend(run_dir).get(key))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def live_supervisor(run_dir: str, key: str) -> bool:
    """Does ``key`` name a live supervisor? (Two nodes of a distributed run on one host: the
    first one's answers `gpusnap snap`.)"""
    return lifeline.alive((read_supervisor(run_dir, key) or {}).get("pid"))


def announce(run_dir: str, key: str, socket_path: str) -> None:
    """Say, in ``key``, that this process listens at ``socket_path``. StoreError on a full disk."""
    info = {"pid": os.getpid(), "socket": socket_path, "started": time.time(), "host": socket.gethostname()}
    LocalBackend(run_dir).put(key, [json.dumps(info, indent=1).encode() + b"\n"])


def withdraw(run_dir: str, key: str) -> None:
    """Remove supervisor file ``key`` if this process wrote it."""
    if (read_supervisor(run_dir, key) or {}).get("pid") == os.getpid():
        try:
            LocalBackend(run_dir).delete(key)
        except (OSError, GpusnapError):
            pass  # a stale file names a dead pid: `gpusnap snap` says so


class RunLog:
    """``DIR/log.jsonl``, appended to (never through a symbolic link: ``LocalBackend.append``).
    A full disk loses records, never the run."""

    def __init__(self, run_dir: str):
        self._backend = LocalBackend(run_dir)

    def append(self, record: dict) -> None:
        line = json.dumps({"t": round(time.time(), 6), **record}, separators=(",", ":")) + "\n"
        try:
            self._backend.append(LOG_FILE, line.encode())
        except OSError:
            pass  # the snapshot path reports a full disk
