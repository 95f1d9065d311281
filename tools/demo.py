"""gpusnap's demo: snapshot a training run, kill it like a lost node, restart it, compare.

    python tools/demo.py [--dir WORKDIR] [--epochs N]

1. runs tools/demo/train.py with plain python, for reference weights;
2. runs it again under `gpusnap run`, sends SIGUSR1 (a snapshot) mid-epoch, and a few steps
   later SIGKILLs the whole process group, as a preempted node would;
3. runs `gpusnap restart`, which replays setup, fast-forwards to the snapshot's batch, merges
   the snapshot and trains on;
4. compares the final weights byte for byte with the reference. Exit 0 when identical.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from common import wait_for

PROGRAM = Path(__file__).resolve().parent / "demo" / "train.py"


def step_of(out: Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def wait_until(condition, what: str, proc: subprocess.Popen):
    try:
        return wait_for(condition, what, proc)
    except RuntimeError as exc:
        sys.exit(f"demo: {exc}")


def committed_snapshots(run_dir: Path) -> list[dict]:
    listed = subprocess.run([sys.executable, "-m", "gpusnap", "ls", str(run_dir), "--json"], capture_output=True, text=True)
    return json.loads(listed.stdout) if listed.returncode == 0 else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, help="work directory (default: a fresh temporary one)")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    work = (args.dir or Path(tempfile.mkdtemp(prefix="gpusnap-demo-"))).resolve()
    shutil.rmtree(work / "snapshots", ignore_errors=True)
    reference, out, run_dir = work / "reference", work / "run", work / "snapshots"
    for d in (reference, out):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    print(f"demo: working in {work}")

    print("demo: 1/4 training once without interruption, for reference weights ...", flush=True)
    subprocess.run([sys.executable, str(PROGRAM), str(reference), str(args.epochs)], check=True, stdout=subprocess.DEVNULL)

    print("demo: 2/4 training under `gpusnap run`; snapshot mid-epoch, then kill -9 of the whole job", flush=True)
    command = [sys.executable, "-m", "gpusnap", "run", "--dir", str(run_dir), str(PROGRAM), str(out), str(args.epochs)]
    run = subprocess.Popen(command, start_new_session=True)
    wait_until(lambda: step_of(out) >= 75, "step 75", run)
    os.kill(run.pid, signal.SIGUSR1)
    snap = wait_until(lambda: committed_snapshots(run_dir), "the snapshot to commit", run)[-1]
    kill_at = step_of(out) + 20
    wait_until(lambda: step_of(out) >= kill_at, f"step {kill_at}", run)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    print(f"demo:     snapshot {snap['id']} at step {snap['iteration']} (stall {snap['stall_s'] * 1000:.1f} ms); "
          f"job killed at step {step_of(out)}; final weights written: {(out / 'final.pt').exists()}", flush=True)

    print(f"demo: 3/4 gpusnap restart {run_dir}", flush=True)
    restarted = subprocess.run([sys.executable, "-m", "gpusnap", "restart", str(run_dir)])
    if restarted.returncode != 0:
        print(f"demo: restart failed with status {restarted.returncode}", file=sys.stderr)
        return 1

    print("demo: 4/4 comparing final weights with the uninterrupted run", flush=True)
    import torch

    expected, got = torch.load(reference / "final.pt"), torch.load(out / "final.pt")
    differing = [name for name in expected if not torch.equal(expected[name], got[name])]
    if differing:
        print(f"demo: FAILED: {len(differing)} tensors differ: {', '.join(differing)}", file=sys.stderr)
        return 1
    print(f"demo: identical: all {len(expected)} tensors of the restarted run equal the uninterrupted run's bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
