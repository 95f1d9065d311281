"""The short version of tools/chaos.py: faults at random moments (kill -9 of the trainee, the
writer, the supervisor, the whole job, gc and a restore; ENOSPC, EIO and a read-only store
injected mid-write; EIO on reads, a torn manifest, errors in the fork window, bad answers of the
metadata service, a stopped supervisor). Nothing committed may be lost and no restart may end
with other bytes than an uninterrupted run. The seed is printed (GPUSNAP_TEST_SEED replays it).
The two slowest faults, a full disk and forged c10d keys, have end-to-end tests of their own
(tests/e2e/test_e2e_full_disk.py, tests/e2e/test_e2e_dist.py) and run in the full tool only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from harness import REPO

sys.path.insert(0, str(REPO / "tools"))
from chaos import KINDS  # noqa: E402

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop


def test_faults_at_random_moments_lose_nothing_committed(tmp_path):
    seed = int(os.environ.get("GPUSNAP_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"chaos seed={seed} (GPUSNAP_TEST_SEED={seed} replays it)")
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "chaos.py"), "--events", "8", "--seed", str(seed), "--dir", str(tmp_path), "--steps", "200",
         "--kinds", ",".join(kind for kind in KINDS if kind not in ("full-disk", "forged-c10d"))],
        capture_output=True, text=True, timeout=600,
    )
    print(done.stdout)
    summary = re.search(r"summary: (\d+) events, .*?(\d+) runs finished and compared, (\d+) snapshots committed; "
                        r"lost (\d+), wrong restores (\d+), last restart refused (\d+), stuck after a fault (\d+)", done.stdout)
    assert summary, done.stdout + done.stderr
    events, finished, committed, lost, wrong, refused, stuck = map(int, summary.groups())
    assert (lost, wrong, refused, stuck) == (0, 0, 0, 0), f"seed={seed}\n{done.stdout}"
    assert events == 8 and finished >= 1 and committed >= 1, f"seed={seed}: the chaos did not exercise a restart"
    assert done.returncode == 0
