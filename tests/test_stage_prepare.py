"""Between snapshots, in the trainee: the staging pool allocated ahead, tensors collapsed into
huge pages, and the thread that does both only while no writer runs."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import psutil
import pytest
import torch

from gpusnap.stage import hugepages
from gpusnap.stage.pool import HostPool, address_view
from gpusnap.stage.prepare import _Worker

MiB = 1 << 20
HUGE = hugepages.HUGE_PAGE


def allocated(pool: HostPool) -> int:
    return os.fstat(pool._fd).st_blocks * 512


def test_allocate_fills_the_pool_outside_the_resident_set_and_only_where_it_is_empty():
    pool = HostPool(64 * MiB)
    rss = psutil.Process().memory_info().rss
    assert len(list(pool.allocate(16 * MiB))) == 2  # 8 MiB a step
    assert allocated(pool) >= 16 * MiB
    assert psutil.Process().memory_info().rss - rss < 8 * MiB  # through the file, not the mapping

    assert pool.write(20 * MiB, b"x" * MiB)  # what a drain wrote ...
    list(pool.allocate(24 * MiB))
    assert bytes(pool.view(20 * MiB, MiB)) == b"x" * MiB  # ... is never zeroed over
    assert allocated(pool) >= 24 * MiB
    assert list(pool.allocate(24 * MiB)) == []  # nothing left to do


def steps(ran: list, tag: str, n: int = 3):
    for _ in range(n):
        ran.append(tag)
        yield


def test_the_worker_does_nothing_while_a_writer_runs_and_finishes_a_step_before_the_fork():
    worker = _Worker()
    ran = []
    worker.writer_starting()
    worker.start(steps(ran, "held"))
    assert worker.idle.wait(30)
    assert ran == []
    worker.writer_done()

    in_step, step_over = threading.Event(), threading.Event()

    def slow_steps():
        while True:
            in_step.set()
            time.sleep(0.2)
            step_over.set()
            ran.append("slow")
            yield

    worker.start(slow_steps())
    assert in_step.wait(30)
    worker.writer_starting()  # waits for the step in progress, then nothing more runs
    assert step_over.is_set()
    done = len(ran)
    assert worker.idle.wait(30)
    assert len(ran) == done


def test_new_work_replaces_the_old():
    worker = _Worker()
    ran = []
    worker.writer_starting()
    worker.start(steps(ran, "old"))  # held back by the writer ...
    worker.writer_done()
    worker.start(steps(ran, "new"))  # ... and replaced before it could run
    assert worker.idle.wait(30)
    assert ran == ["new"] * 3


def test_huge_spans_are_the_whole_aligned_huge_pages_inside_each_range():
    assert hugepages.huge_spans([(HUGE - 1, HUGE)]) == []  # no whole huge page inside
    assert hugepages.huge_spans([(1, 3 * HUGE)]) == [(HUGE, 3 * HUGE)]
    assert hugepages.huge_spans([(4 * HUGE, 2 * HUGE), (HUGE, 3 * HUGE), (5 * HUGE, HUGE)]) == [(HUGE, 6 * HUGE)]


def anon_huge_bytes(address: int) -> int:
    """AnonHugePages of the mapping that holds ``address`` in this process."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and ":" not in first:
                lo, hi = (int(x, 16) for x in first.split("-"))
                inside = lo <= address < hi
            elif inside and first == "AnonHugePages:":
                return int(line.split()[1]) * 1024
    return 0


def test_collapse_backs_a_tensor_with_huge_pages_and_keeps_its_bytes():
    tensor = torch.randn(6 * HUGE // 4)  # 12 MiB of float32: at least 5 whole huge pages
    storage = tensor.untyped_storage()
    address, nbytes = storage.data_ptr(), storage.nbytes()
    before = hashlib.sha256(address_view(address, nbytes)).hexdigest()
    results = list(hugepages.collapse([(address, nbytes)]))
    if not any(results):
        pytest.skip("this kernel does not collapse huge pages (MADV_COLLAPSE, Linux >= 6.1)")
    assert len(results) >= 5
    assert hashlib.sha256(address_view(address, nbytes)).hexdigest() == before
    assert anon_huge_bytes(address) >= sum(results) * HUGE
