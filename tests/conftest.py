"""The fake GPU's stream order for the session: one seed, drawn here unless GPUSNAP_FAKE_SEED is
set, shared by every test process and every program the tests start (they inherit the
environment), shown in the header and with every failure, so that a failure on the fake GPU can
be replayed with the same order."""

from __future__ import annotations

import os
import random
import sys

import pytest

# Set at import, before any test module imports gpusnap.knobs (which reads it once); the workers
# of pytest-xdist inherit it from the process that starts them.
os.environ.setdefault("GPUSNAP_FAKE_SEED", str(random.SystemRandom().randrange(1 << 32)))


def _replay() -> str:
    line = f"GPUSNAP_FAKE_SEED={os.environ['GPUSNAP_FAKE_SEED']}"
    machine = sys.modules.get("gpusnap.device.fake.machine")
    own = machine.seed() if machine is not None else None
    if own is not None and str(own) != os.environ["GPUSNAP_FAKE_SEED"]:
        line += f" (this test's own fake machine: seed {own})"
    return line


def pytest_report_header(config):
    return f"fake GPU stream order: {_replay()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("fake GPU stream order", f"replay with {_replay()}"))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, each worker starts on its own share of the long (``slow``) tests.

    xdist's ``worksteal`` hands each worker one contiguous run of the collection and lets an idle
    worker take the end of the longest queue. In collection order the long end-to-end tests sat
    together, so one or two workers held most of them and the run ended on a tail of long tests
    with the other cores idle. Here every worker's run begins with every n-th long test and ends
    with short ones, which are what gets stolen. Every worker orders the same collection the same
    way, as xdist requires."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    fast = [item for item in items if not item.get_closest_marker("slow")]
    ordered, left = [], len(items)
    for k in range(workers):
        size = left // (workers - k)  # the share xdist hands worker k (``WorkStealingScheduling``)
        share = slow[k::workers][:size]
        ordered += share + fast[: size - len(share)]
        del fast[: size - len(share)]
        left -= size
    placed = set(ordered)
    items[:] = ordered + [item for item in slow if item not in placed] + fast
