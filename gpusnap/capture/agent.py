"""Trainee side of a snapshot (being written): install(config), request_from_program()."""

from __future__ import annotations

import warnings

_installed = False


def install(config: dict) -> None:
    global _installed
    _installed = True


def request_from_program(reason: str) -> bool:
    if not _installed:
        warnings.warn("gpusnap.snapshot() does nothing: this program is not running under `gpusnap run`", stacklevel=3)
        return False
    return True
