"""Periodic snapshots with no core idle: does the writer commit within its pacer's deadline
(issue 26, goal 3: max(2 s, 2x its store-alone time))?

    python tools/bench_busy.py [--base /path/to/other/checkout] [--runs 6] [--dir /work/bench-tmp] [--out FILE]

One run: `gpusnap run` of `tests/programs/busy_workers.py` (three persistent DataLoader workers,
each with a thread that spins, and a training loop that spins: seven runnable threads on the
CI machine's two cores, and 64 MiB of state that changes every step), SIGUSR1 after its fifth
step; from log.jsonl and the manifest, the snapshot's `write_s` (fork to commit), the pacer's
deadline, its boosts, and the step at which the commit reached the run log. Runs alternate
between this checkout and `--base` (ABBA), each tree running its own copy of the program.

A benchmark, not a test: whether a starved writer makes its deadline is a matter of the
scheduler, and the figure is the share of runs that do, beside the write times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys

from common import against_base, alternating, read_json, wait_for

STEPS = 80


def one_run(tree: str, work: str) -> dict:
    run_dir, out = os.path.join(work, "run"), os.path.join(work, "out")
    for d in (run_dir, out):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(out)
    program = os.path.join(tree, "tests", "programs", "busy_workers.py")
    env = dict(os.environ, PYTHONPATH=tree, TEST_STEP_SLEEP_S="0")
    proc = subprocess.Popen([sys.executable, "-m", "gpusnap", "run", "--dir", run_dir, "--resume", "never", program, out,
                             str(STEPS)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work,
                            start_new_session=True)

    def step() -> int:
        try:
            with open(os.path.join(out, "progress")) as f:
                return int(f.read() or 0)
        except (OSError, ValueError):
            return 0

    def said() -> dict | None:
        try:
            with open(os.path.join(run_dir, "log.jsonl")) as f:
                return next((e for e in map(json.loads, f) if e.get("event") == "committed"), None)
        except (OSError, ValueError):
            return None

    try:
        wait_for(lambda: step() >= 5, "step 5", proc=proc)
        os.kill(proc.pid, signal.SIGUSR1)
        committed = wait_for(said, "the commit in the run log", proc=proc, timeout=300)
        at = step()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the steps left only spin
        proc.wait()
    manifest = read_json(os.path.join(run_dir, "snapshots", f"{committed['id']}.json"))
    writer = manifest["writer"]
    return {"write_s": committed["write_s"], "deadline_s": writer.get("deadline_s"), "boosts": writer.get("boosts"),
            "boosted_s": writer.get("boosted_s"), "said_at_step": at}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="runs of each tree")
    args, say, trees = against_base(parser, "bench_busy")
    say(f"# {os.cpu_count()} cores; load avg {os.getloadavg()[0]:.2f}; {args.runs} runs each; busy_workers.py, SIGUSR1 at step 5 of {STEPS}")
    work = os.path.join(args.dir, f"bench_busy-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    try:
        for _, name in alternating(trees, args.runs):
            r = one_run(trees[name], work)
            results[name].append(r)
            say(f"{name}: write {r['write_s']:.2f} s against a {r['deadline_s']} s deadline; boosts {r['boosts']} "
                f"({r['boosted_s']} s); the run log said it at step {r['said_at_step']} of {STEPS}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, runs in results.items():
        within = sum(r["write_s"] <= r["deadline_s"] for r in runs)
        say(f"{name}: {within} of {len(runs)} within the deadline; write median {statistics.median(r['write_s'] for r in runs):.2f} s, "
            f"max {max(r['write_s'] for r in runs):.2f} s; said after the last step in "
            f"{sum(r['said_at_step'] >= STEPS for r in runs)} of {len(runs)}")
    say("# raw " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
