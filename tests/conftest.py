"""The fake GPU's stream order for the session: one seed, drawn here unless GPUSNAP_FAKE_SEED is
set, shared by every test process and every program the tests start (they inherit the
environment), shown in the header and with every failure, so that a failure on the fake GPU can
be replayed with the same order. And every `gpusnap run` a test started (harness.Run) ends with the
test, whatever its outcome."""

from __future__ import annotations

import os
import random
import resource
import sys
import time

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


ALL = os.environ.get("GPUSNAP_TEST_CORPUS") == "all"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``more`` repeat, in another shape, what a test of the default run covers:
    left out of it (CI's 12 minutes), run with GPUSNAP_TEST_CORPUS=all."""
    if not ALL:
        kept, left = [], []
        for item in items:
            (left if item.get_closest_marker("more") else kept).append(item)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        items[:] = _slow_spread(items)


def _slow_spread(items: list) -> list:
    """The tests in file order, the slow ones spread evenly over the first 85% of the list.
    pytest-xdist's worksteal scheduler gives each worker a contiguous share of the collection,
    and a worker that runs out takes the end of another's. In file order the end-to-end folder
    is one block, and the last minutes were the launch, stage and store folders' longest tests,
    with the other workers idle (the last 8% of CI's tests took a third of its minutes); all
    slow tests first ran four end-to-end runs at once for half the run, and cost 170 s more CPU.
    Every worker collects the same order (xdist requires it)."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    quick = [item for item in items if not item.get_closest_marker("slow")]
    if not slow or not quick:
        return items
    span = max(1, int(len(items) * 0.85))
    out: list = []
    taken = 0
    for i, item in enumerate(slow):
        due = (i * span) // len(slow)  # the position it is spread to
        while len(out) < due and taken < len(quick):
            out.append(quick[taken])
            taken += 1
        out.append(item)
    return out + quick[taken:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("fake GPU stream order", f"replay with {_replay()}"))


CPU_LOG = os.environ.get("GPUSNAP_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With GPUSNAP_TEST_CPU_LOG=FILE, each test's CPU seconds (its own and its reaped processes':
    not the reference runs the forkserver starts) and wall seconds, a line each in FILE: CI's
    minutes are the two cores', and what a test costs them is its CPU (tools/suite_cpu.py sums them)."""
    if not CPU_LOG:
        yield
        return
    before, wall = _cpu_s(), time.monotonic()
    yield
    with open(CPU_LOG, "a") as log:
        log.write(f"{_cpu_s() - before:.2f} {time.monotonic() - wall:.2f} {item.nodeid}\n")


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.fixture(autouse=True)
def _no_run_left_behind():
    """Whatever the test, no `gpusnap run` it started outlives it (harness.Run)."""
    yield
    harness = sys.modules.get("harness")
    if harness is not None:
        harness.kill_what_is_left()
