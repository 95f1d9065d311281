"""gpusnap: transparent snapshots of unmodified Python training programs.

The only API a program needs is none: run it under ``gpusnap run``. A program that wants to
ask for a snapshot itself calls ``gpusnap.snapshot()``.
"""

from __future__ import annotations

__version__ = "0.1.0"


def snapshot(reason: str = "program") -> bool:
    """Ask for a snapshot at the next safe point. Returns False (with a warning) when the
    program is not running under ``gpusnap run``."""
    from gpusnap.capture.trainee import control

    return control.request_from_program(reason)
