"""The files a supervisor keeps in its run directory (docs/FORMAT.md): ``supervisor.json``
(``supervisor-HOST.json`` for each node of a distributed run) says where it listens for `gpusnap
snap`, and ``log.jsonl`` is the run log, one JSON object a line."""

from __future__ import annotations

import json
import os
import socket
import time

from gpusnap import lifeline
from gpusnap.atomic import open_private, write_file

SUPERVISOR_FILE = "supervisor.json"
LOG_FILE = "log.jsonl"


def supervisor_file(run_dir: str, distributed: bool) -> str:
    """Where a supervisor says where it listens. The nodes of a distributed run share the run
    directory, and a unix socket answers only on its own host: one file per host there."""
    return os.path.join(run_dir, f"supervisor-{socket.gethostname()}.json" if distributed else SUPERVISOR_FILE)


def read_supervisor(path: str) -> dict | None:
    """What the supervisor file at ``path`` says; None when there is none or it does not parse."""
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def live_supervisor(path: str) -> bool:
    """Does ``path`` name a live supervisor? (Two nodes of a distributed run on one host: the
    first one's answers `gpusnap snap`.)"""
    pid = (read_supervisor(path) or {}).get("pid")
    return lifeline.alive(pid)


def announce(path: str, socket_path: str) -> None:
    """Say, at ``path``, that this process listens at ``socket_path``. StoreError on a full disk."""
    info = {"pid": os.getpid(), "socket": socket_path, "started": time.time(), "host": socket.gethostname()}
    write_file(path, [json.dumps(info, indent=1).encode() + b"\n"])


def withdraw(path: str) -> None:
    """Remove the supervisor file at ``path`` if this process wrote it."""
    if (read_supervisor(path) or {}).get("pid") == os.getpid():
        try:
            os.unlink(path)
        except OSError:
            pass


class RunLog:
    """``DIR/log.jsonl``, appended to. Opened never through a symbolic link, as the lock:
    appending to whatever file one names would let anyone who can write the directory make the
    run write there. A full disk loses records, never the run."""

    def __init__(self, run_dir: str):
        self._fd = open_private(os.path.join(run_dir, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def append(self, record: dict) -> None:
        if self._fd < 0:
            return
        line = json.dumps({"t": round(time.time(), 6), **record}, separators=(",", ":")) + "\n"
        try:
            os.write(self._fd, line.encode())
        except OSError:
            pass  # the snapshot path reports a full disk

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
