"""Stop snapshots of one training state by two gpusnap trees, alternating, each against the disk's
bandwidth measured just before it: what a change to the writer does to a stop snapshot's time.

    python tools/bench_stop.py [--base /path/to/other/checkout] [--pairs 6] [--width 4096]
                               [--dir /work/bench-tmp] [--out FILE]

One run: `gpusnap run` of an MLP (`--width`, 5 layers: 4096 gives 1.34 GB of parameters,
gradients and Adam state) trained with Adam; after its fifth step, the disk's sequential write
bandwidth in the run directory (`bench_snapshot.disk_bandwidth`: 1 GiB in 16 MiB blocks,
fsync'd), then SIGTERM; the stop snapshot's `write_s` (fork to commit) from log.jsonl. Runs
alternate between this checkout and `--base` (ABBA order, so that a slow spell of the disk falls
on both), and the medians are printed with every run.

Why a benchmark of its own: on a virtual disk, the bandwidth measured in one run moves by half
from one minute to the next (1.3 to 4.2 GB/s on the CI machine kind), so a ratio of one stop
snapshot to one bandwidth says little about a change; alternating runs of the two trees do.
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
import textwrap
import time

from bench_snapshot import disk_bandwidth
from common import against_base, alternating


PROGRAM = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = int(sys.argv[2])
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(5)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(64, width)
    for step in range(1_000_000):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 4:
            open(sys.argv[1], "w").close()
    """
)


def one_run(tree: str, work: str, program: str, width: int) -> dict:
    run_dir, ready = os.path.join(work, "run"), os.path.join(work, "ready")
    shutil.rmtree(run_dir, ignore_errors=True)
    if os.path.exists(ready):
        os.remove(ready)
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.Popen([sys.executable, "-m", "gpusnap", "run", "--dir", run_dir, "--resume", "never", program, ready,
                             str(width)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=work)
    try:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise RuntimeError(f"gpusnap run exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.2)
        time.sleep(1.0)  # the trainee's preparation thread readies the next drain region
        disk = disk_bandwidth(work, 1 << 30)
        with open(os.path.join(run_dir, "supervisor.json")) as f:
            os.kill(json.load(f)["pid"], signal.SIGTERM)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        committed = [e for e in map(json.loads, f) if e.get("event") == "committed"][-1]
    manifest = json.load(open(os.path.join(run_dir, "snapshots", f"{committed['id']}.json")))
    floor = committed["bytes_written"] / disk["bps"]
    return {"write_s": committed["write_s"], "bytes_written": committed["bytes_written"], "disk_bps": disk["bps"],
            "ratio": committed["write_s"] / floor, "windows": manifest.get("writer", {}).get("windows")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--width", type=int, default=4096)
    args, say, trees = against_base(parser, "bench_stop")
    say(f"# {os.cpu_count()} cores; load avg {os.getloadavg()[0]:.2f}; width {args.width}; {args.pairs} pairs")
    work = os.path.join(args.dir, f"bench_stop-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    program = os.path.join(work, "train.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    try:
        for _, name in alternating(trees, args.pairs):
            r = one_run(trees[name], work, program, args.width)
            results[name].append(r)
            say(f"{name}: fork to commit {r['write_s']:.3f} s for {r['bytes_written'] / 1e9:.3f} GB; disk "
                f"{r['disk_bps'] / 1e9:.2f} GB/s; {r['ratio']:.2f}x; windows {r['windows']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, runs in results.items():
        say(f"{name}: median fork to commit {statistics.median(r['write_s'] for r in runs):.3f} s, median ratio "
            f"{statistics.median(r['ratio'] for r in runs):.2f}x (goal <= 1.25x) over {len(runs)} runs")
    say("# raw " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
