"""``gpusnap demo``: snapshot a training run, kill it like a lost node, restart it, compare.

1. runs the bundled ``train.py`` with plain python, for reference weights;
2. runs it again under ``gpusnap run``, sends SIGUSR1 (a snapshot) mid-epoch and, a few steps
   after the snapshot commits, SIGKILLs the whole process group, as a preempted node would;
3. runs ``gpusnap restart``, which replays setup, fast-forwards to the snapshot's batch, merges
   the snapshot and trains on;
4. compares the final weights byte for byte with the reference.

It ships inside the package, so it works after a plain ``pip install``; the CLI (which never
imports torch) calls ``run``, which imports torch only to compare the weights at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "train.py"
SNAPSHOT_AT_STEP = 75
KILL_AFTER_STEPS = 20


class DemoFailed(Exception):
    pass


def _say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def _step_of(out: Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _wait_until(condition, what: str, proc: subprocess.Popen, timeout_s: float = 600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            raise DemoFailed(f"the training run exited (status {proc.returncode}) while waiting for {what}")
        time.sleep(0.05)
    raise DemoFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _gpusnap(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpusnap", *args]


def _committed(run_dir: Path) -> list[dict]:
    listed = subprocess.run(_gpusnap("ls", str(run_dir), "--json"), capture_output=True, text=True)
    return json.loads(listed.stdout) if listed.returncode == 0 else []


def _restart(run_dir: Path) -> tuple[float, float, str, str]:
    """Run ``gpusnap restart``, passing its output through; (seconds until the snapshot was
    restored, seconds until it ended, restore's own split of the time, what its witness said)."""
    started = time.perf_counter()
    proc = subprocess.Popen(_gpusnap("restart", str(run_dir)), stderr=subprocess.PIPE, text=True)
    restored_s, timings, witness = None, "", "unverified: the snapshot has no witness"
    for line in proc.stderr:
        sys.stderr.write(line)
        if line.startswith("gpusnap: restored snapshot") and restored_s is None:
            restored_s = time.perf_counter() - started
            timings = next((part.strip() for part in line.split(";") if part.strip().startswith("replay")), "")
        elif line.startswith("gpusnap: snapshot") and " verified: " in line:
            witness = "verified: " + line.split(" verified: ", 1)[1].strip()
    if proc.wait() != 0:
        raise DemoFailed(f"restart failed with status {proc.returncode}")
    if restored_s is None:
        raise DemoFailed("restart ended without restoring the snapshot")
    return restored_s, time.perf_counter() - started, timings, witness


def run(work: Path, epochs: int, store: str | None = None) -> int:
    """The whole demo in ``work``; 0 when the restarted run's weights equal the reference's.
    ``store``: the run directory is this URL (s3://...): the snapshot is restarted from the
    store, with the local level deleted first, as a machine that lost its disk would."""
    reference, out, run_dir = work / "reference", work / "run", store or work / "snapshots"
    cache = work / "cache"
    if store:
        os.environ["GPUSNAP_LEVEL_DIR"] = str(cache)  # the subprocesses' local level
    for d in (reference, out, cache) if store else (reference, out, run_dir):
        shutil.rmtree(d, ignore_errors=True)
    reference.mkdir(parents=True)
    out.mkdir(parents=True)
    _say(f"working in {work}")

    _say("1/4 training once without interruption, for reference weights ...")
    subprocess.run([sys.executable, str(PROGRAM), str(reference), str(epochs)], check=True, stdout=subprocess.DEVNULL)

    _say("2/4 training under `gpusnap run`; a snapshot mid-epoch, then kill -9 of the whole job")
    job = subprocess.Popen(_gpusnap("run", "--dir", str(run_dir), str(PROGRAM), str(out), str(epochs)), start_new_session=True)
    try:
        _wait_until(lambda: _step_of(out) >= SNAPSHOT_AT_STEP, f"step {SNAPSHOT_AT_STEP}", job)
        os.kill(job.pid, signal.SIGUSR1)
        snap = _wait_until(lambda: [s for s in _committed(run_dir) if "shared" in s.get("level", "shared")],
                           "the snapshot to commit" + (" and reach the store" if store else ""), job)[-1]
        # Counted from the snapshot's step, not from when `gpusnap ls` showed it: on a loaded
        # machine the listing lagged 35 steps behind the commit, and the run ended first.
        kill_at = snap["iteration"] + KILL_AFTER_STEPS
        _wait_until(lambda: _step_of(out) >= kill_at, f"step {kill_at}", job)
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
    _say(
        f"    snapshot {snap['id']} at step {snap['iteration']}: training stalled {snap['stall_s'] * 1000:.1f} ms, "
        f"{snap['bytes_written'] / 1e6:.2f} MB written for {snap['bytes_total'] / 1e6:.2f} MB of state; "
        f"job killed at step {_step_of(out)}, final weights written: {(out / 'final.pt').exists()}"
    )

    if store:
        shutil.rmtree(cache, ignore_errors=True)
        _say(f"    deleted the local level {cache}, as a reclaimed machine loses its disk")
    _say(f"3/4 gpusnap restart {run_dir}")
    restored_s, finished_s, timings, witness = _restart(run_dir)
    _say(f"    restored {restored_s:.1f} s after the command started ({timings}); training finished {finished_s:.1f} s after it")
    _say(f"    the restart checked itself against what followed the snapshot: {witness}")

    _say("4/4 comparing the final weights with the uninterrupted run's")
    import torch

    expected, got = torch.load(reference / "final.pt"), torch.load(out / "final.pt")
    differing = [name for name in expected if not torch.equal(expected[name], got[name])]
    if differing:
        raise DemoFailed(f"{len(differing)} of {len(expected)} tensors differ: {', '.join(differing)}")
    _say(f"identical: all {len(expected)} tensors of the restarted run equal the uninterrupted run's, byte for byte")
    return 0
