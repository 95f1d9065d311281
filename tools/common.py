"""Helpers shared by the scripts in tools/ (each run as ``python tools/NAME.py``, so this module
is importable beside them)."""

from __future__ import annotations

import json
import time


def wait_for(predicate, what: str, proc=None, timeout: float = 300):
    """Poll ``predicate`` until it returns something true and return that. Raises RuntimeError
    when ``proc`` (a Popen) exits first, with its stderr if it was piped, or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr is not None else ""
            raise RuntimeError(f"the program exited (status {proc.returncode}) while waiting for {what}"
                               + (f": {err}" if err else ""))
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def read_json(path):
    """The JSON document at ``path``, or None while it is missing or half-written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
