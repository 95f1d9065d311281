"""Distributed runs end to end: torchrun jobs on CPU over gloo, under the real CLI.

Each program in tests/programs/dist runs once under plain torchrun (the reference) and once under
`gpusnap run --nproc-per-node N`; the second is snapshotted at a random step, killed -9 (the whole
job, or one rank alone), restarted, and must end with every rank's final state byte for byte
the reference's. Seeds are logged.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import Run, _env, assert_same, committed_ids, copy_programs, gpusnap, wait_for

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

# Startup of several ranks on the CI machine's 2 cores takes seconds; the programs pace their steps.
STEP_SLEEP = {"TEST_STEP_SLEEP_S": "0.05"}


def torchrun(*args, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", *map(str, args)], cwd=cwd,
                            capture_output=True, text=True, timeout=timeout, env=_env({**STEP_SLEEP, **(env or {})}))
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def rank_progress(out: Path, rank: int) -> int:
    try:
        return int((out / f"rank{rank}" / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def least_progress(out: Path, ranks: int) -> int:
    return min(rank_progress(out, r) for r in range(ranks))


def rank_pids(run: Run) -> dict[int, int]:
    """rank -> pid of the job's rank processes (children of torchrun's agent)."""
    import psutil

    found = {}
    for p in psutil.Process(run.proc.pid).children(recursive=True):
        try:
            if "gpusnap.boot" in p.cmdline():
                env = p.environ()
                if "RANK" in env:
                    found[int(env["RANK"])] = p.pid
        except psutil.Error:
            continue
    return found


def snapshot_at(run: Run, run_dir: Path, out: Path, ranks: int, step: int) -> str:
    wait_for(lambda: least_progress(out, ranks) >= step, f"step {step} on every rank", proc=run, timeout=180)
    before = committed_ids(run_dir)
    run.signal(signal.SIGUSR1)
    return max(wait_for(lambda: committed_ids(run_dir) - before, "a committed global snapshot", proc=run, timeout=120))


def compare(ref: Path, out: Path, ranks: int) -> None:
    for r in range(ranks):
        assert_same(torch.load(out / f"rank{r}" / "final.pt", weights_only=False),
                    torch.load(ref / f"rank{r}" / "final.pt", weights_only=False), f"rank {r}")


def _setup(tmp_path: Path):
    progs = copy_programs(tmp_path) / "dist"
    ref, out = tmp_path / "ref", tmp_path / "out"
    return progs, ref, out, tmp_path / "run"


@pytest.mark.parametrize("program,args,ranks,victim", [
    ("ddp.py", ["5"], 2, "all"),
    ("ddp.py", ["5"], 2, "one"),
    ("allreduce.py", ["150"], 2, "all"),
    ("ddp.py", ["8"], 4, "all"),
])
def test_kill_and_restart_matches_uninterrupted(tmp_path, program, args, ranks, victim):
    seed = int(os.environ.get("TEST_SEED") or random.randrange(1 << 30))
    print(f"seed {seed}")
    rnd = random.Random(seed)
    progs, ref, out, run_dir = _setup(tmp_path)
    reference = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                                  program, ref, *args], cwd=progs, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, env=_env(STEP_SLEEP))
    run = Run("run", "--nproc-per-node", ranks, "--dir", run_dir, program, out, *args, cwd=progs, env=STEP_SLEEP)
    snap = snapshot_at(run, run_dir, out, ranks, rnd.randint(3, 15))
    kill_at = least_progress(out, ranks) + rnd.randint(1, 5)
    wait_for(lambda: least_progress(out, ranks) >= kill_at, f"step {kill_at}", proc=run, timeout=120)
    if victim == "all":
        run.kill_group()
    else:  # one rank alone: torchrun's agent ends the others, and the job fails
        os.kill(rank_pids(run)[rnd.randrange(ranks)], signal.SIGKILL)
        code, _, err = run.wait(timeout=120)
        assert code not in (0, 75), err[-3000:]
    assert not any((out / f"rank{r}" / "final.pt").exists() for r in range(ranks)), "finished before the kill"
    listed = json.loads(gpusnap("ls", run_dir, "--json", cwd=progs).stdout)
    assert [s["id"] for s in listed][-1] == snap
    restart = gpusnap("restart", run_dir, cwd=progs, timeout=300, env=STEP_SLEEP)
    assert restart.returncode == 0, restart.stderr[-4000:]
    assert f"resuming from snapshot {snap}" in restart.stderr
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err[-3000:]
    compare(ref, out, ranks)
