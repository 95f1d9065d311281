"""Shared by the programs that run without torch (and by ../common.py): progress for the test
harness, final state as JSON, so that two runs compare byte for byte under any interpreter."""

import fcntl
import json
import os
import sys
import time

OUT = sys.argv[1]
STEP_SLEEP_S = float(os.environ.get("TEST_STEP_SLEEP_S", "0.01"))


def progress(step: int) -> None:
    """Tell the harness how far training got (it sends signals by step), then pace the run; and
    wait while the harness holds it (``_held``)."""
    tmp = os.path.join(OUT, "progress.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(OUT, "progress"))
    time.sleep(STEP_SLEEP_S)
    _held()


def _held() -> None:
    """OUT/hold, locked by the harness from a snapshot's fork to its commit (a loaded machine let
    the commit come after the program's end): wait for its lock. No loop here: gpusnap takes a
    loop in the program's files for a place to snapshot."""
    try:
        with open(os.path.join(OUT, "hold")) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
    except FileNotFoundError:
        pass


def finish(**state) -> None:
    """numpy arrays and scalars go in as lists and numbers (``tolist``): exact for floats."""
    with open(os.path.join(OUT, "final.json"), "w") as f:
        json.dump(state, f, sort_keys=True, indent=1, default=lambda value: value.tolist())
