"""Does ``--every auto`` keep training's slowdown within its budget, and what interval does it
choose? For a small and a large state, in one run.

    python tools/bench_overhead.py [--sizes 0.02,0.6] [--minutes 4,12] [--pairs 2,1] [--overhead 1]
                                   [--tail-s 2] [--calibrate MINUTES]
                                   [--trainee-threads spare|all|N] [--dir /work/bench-tmp]
                                   [--out FILE]

For each size S (GB = 1e9 bytes of model + Adam state; the program is bench_snapshot's: an MLP
of square fp32 Linear layers trained with torch.optim.Adam on small batches, so every step
writes every parameter and both Adam moments):

1. The anchor: the program under `gpusnap run` with no snapshot at all, for --minutes; the
   number of steps it made is N for every run of this size.
2. The same program under `gpusnap run --every auto --overhead P%`, N steps.
3. Again, --pairs times in all, each pair in the other order (anchor first, then auto first),
   so that a machine whose load drifts weighs on both alike.

Each run's training time is the time from the end of the warm-up (WARMUP_STEPS) to its N-th
step, read from the step stamps the program writes. The slowdown of an auto run is its
training time over the mean of the anchors' (true overhead: what the budget is about); next to
it, the overhead gpusnap measured itself (its costs over the run's training time; the last
`schedule` record in DIR/log.jsonl has it up to the last cost), the
intervals it chose, the snapshots it took, and each snapshot's measured cost. The noise is the
spread of the anchors' times.

On a machine shared with other jobs, whole runs minutes apart differ by far more than a 1%
budget (on the CI machine, the same 0.6 GB program took 0.40 s a step in one run and 0.70 s in
another, minutes apart), so each auto run is also measured from within, independently of gpusnap's own windows:
every step from a snapshot's fork to --tail-s after its commit counts as affected, and is
compared with the unaffected steps within AROUND_S of that period (in-run overhead: the sum of
the affected steps' excess over the training time, +- its standard error from the spread of the
periods' excesses). Its baseline is local, so it follows the machine's load.

How long after its commit does a snapshot still slow training? --calibrate MINUTES answers it
first, per size: one run with a snapshot every CALIBRATE_EVERY_S, and for each snapshot the
excess of the steps from its fork to its commit plus 0, 2, 5, 10 and 20 s over the steps far
from any snapshot (at least FAR_S away, within AROUND_S), beside the cost gpusnap measured for
it. Where the excess stops growing with the tail, the slowdown has ended: that tail is the
right --tail-s (a longer one only adds noise). It also shows whether gpusnap's own measure is
biased against one that waits far longer.

Verdict: from the anchors when their spread is below the budget (HELD when the median true
overhead is at most the budget), else from the in-run overhead (HELD (in-run) when its median is
at most the budget), NOT HELD otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from common import MLP

GB = 1e9
WARMUP_STEPS = 5
# In-run measure: steps this long after a commit still count as affected (--tail-s). Measured
# with --calibrate on the CI machine (tools/results/bench_overhead-cpu-2026-11-26*.txt): a 0.6
# GB snapshot's excess up to its commit was 0.31 +- 0.26 s and 0.33 +- 0.10 s in two runs, and
# no more with longer tails (within their errors); the 10 s used before only added noise, and at
# intervals of 12-20 s left almost no unaffected step to compare with.
TAIL_S = 2.0
AROUND_S = 60.0  # ... against the unaffected steps this close to the affected period
CALIBRATE_EVERY_S = 60  # --calibrate: one snapshot a minute, so that most steps are far from any
CALIBRATE_TAILS_S = (0, 2, 5, 10, 20)
FAR_S = 20.0  # --calibrate: baseline steps start at least this far from any snapshot's period
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent(
    '''
    import os, sys, time
    import torch

    {MLP}
    state_bytes, stamps_path, steps, deadline = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    torch.set_num_threads(int(os.environ["BENCH_TRAINEE_THREADS"]))
    model, opt, x, _, _ = build(state_bytes)
    stamps = open(stamps_path, "w")
    for it in range(steps):
        stamps.write(f"{time.time():.6f}\\n")
        stamps.flush()
        if time.time() > deadline:
            break
        step(model, opt, x)
    stamps.write(f"{time.time():.6f}\\n")
    stamps.close()
    '''
).replace("{MLP}\n", MLP + "\n")


def _threads(arg: str) -> int:
    cores = os.cpu_count() or 1
    if arg == "all":
        return cores
    if arg == "spare":
        return max(1, cores - 1)
    return int(arg)


def _stamps(path: str) -> list[float]:
    with open(path) as f:
        return [float(line) for line in f if line.strip()]


def _log(run_dir: str) -> list[dict]:
    try:
        with open(os.path.join(run_dir, "log.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def run_once(work: str, size_gb: float, steps: int, minutes: float, auto: bool, overhead: float, threads: int, tag: str,
             tail_s: float = TAIL_S, every_s: int | None = None) -> dict:
    """One run of the program; ``auto``: under --every auto, ``every_s``: a fixed interval
    (--calibrate), neither: the anchor."""
    run_dir = os.path.join(work, f"run-{tag}")
    shutil.rmtree(run_dir, ignore_errors=True)
    stamps = os.path.join(work, f"stamps-{tag}")
    env = dict(os.environ, BENCH_TRAINEE_THREADS=str(threads))
    # This checkout's gpusnap, whatever an editable install elsewhere points at.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    deadline = time.time() + minutes * 60 if steps <= 0 else time.time() + 24 * 3600
    schedule = ["--every", "auto", "--overhead", f"{overhead:g}%", "--keep", "2"] if auto else []
    if every_s:
        schedule = ["--every", f"{every_s}s", "--keep", "2"]
    cmd = [sys.executable, "-m", "gpusnap", "run", "-q", "--dir", run_dir, "--resume", "never", *schedule,
           os.path.join(work, "train.py"), str(size_gb * GB), stamps, str(steps if steps > 0 else 10**9), str(deadline)]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall_s = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    t = _stamps(stamps)
    made = len(t) - 1
    log = _log(run_dir)
    costs = [e for e in log if e.get("event") == "cost"]
    retunes = [e for e in log if e.get("event") == "schedule"]
    commits = [e for e in log if e.get("event") == "committed"]
    result = {
        "auto": auto, "steps": made, "train_s": t[-1] - t[WARMUP_STEPS], "wall_s": wall_s,
        "snapshots": len(commits),
        "costs_s": [round(e["cost_s"], 4) for e in costs],
        "cost_how": sorted({e.get("how") for e in costs}),
        "stalls_s": [round(e.get("stall_s", 0), 4) for e in commits],
        "write_s": [round(e.get("write_s", 0), 2) for e in commits],
        "intervals_s": [e.get("interval_s") for e in retunes],
        "measured_overhead": retunes[-1].get("overhead") if retunes else None,  # when its last cost came
        # gpusnap's costs over the whole run (the schedule's figure is up to its last cost)
        "measured_run_overhead": sum(e["cost_s"] for e in costs) / (t[-1] - t[WARMUP_STEPS] - sum(e["cost_s"] for e in costs)),
        "first_snapshot_after_s": None,
    }
    forked = [e for e in log if e.get("event") == "forked"]
    commit_t = {e["id"]: e["t"] for e in commits}
    periods = [(f["t"], commit_t.get(f["id"], f["t"]) + tail_s) for f in forked]
    result["in_run_overhead"], result["in_run_se"] = in_run_overhead(t[WARMUP_STEPS:], periods) if periods else (None, None)
    if every_s:
        measured = {e["id"]: e["cost_s"] for e in costs}
        result["calibration"] = calibrate([(f["t"], commit_t.get(f["id"], f["t"]), measured.get(f["id"])) for f in forked],
                                          t[WARMUP_STEPS:])
    steps_ev = [e for e in log if e.get("event") == "steps"]
    if forked and steps_ev:
        result["first_snapshot_after_s"] = round(forked[0]["t"] - steps_ev[0]["t"], 1)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _steps(stamps: list[float]) -> list[tuple[float, float]]:
    return list(zip(stamps, (b - a for a, b in zip(stamps, stamps[1:]))))


def in_run_overhead(stamps: list[float], periods: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(overhead, its standard error): the excess of the steps that start inside ``periods`` over
    the mean of the unaffected steps within AROUND_S of each period, against the training time it
    left; the error from the spread of the periods' excesses."""
    merged: list[list[float]] = []
    for a, b in sorted(periods):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    steps = _steps(stamps)

    def affected(t: float) -> bool:
        return any(a <= t < b for a, b in merged)

    excesses = []
    for a, b in merged:
        inside = [d for t, d in steps if a <= t < b]
        near = [d for t, d in steps if a - AROUND_S <= t < b + AROUND_S and not affected(t)]
        if inside and near:
            excesses.append(sum(inside) - len(inside) * statistics.fmean(near))
    if not excesses:
        return None, None
    excess = sum(excesses)
    train_s = stamps[-1] - stamps[0] - excess
    se = statistics.stdev(excesses) * len(excesses) ** 0.5 / train_s if len(excesses) > 1 else None
    return excess / train_s, se


def calibrate(snapshots: list[tuple[float, float, float | None]], stamps: list[float]) -> dict:
    """For each tail of CALIBRATE_TAILS_S: the excess, per snapshot, of the steps from its fork to
    its commit plus the tail over the steps far from every snapshot (FAR_S, within AROUND_S);
    beside gpusnap's own cost of the same snapshots. ``snapshots``: (fork, commit, measured cost)."""
    steps = _steps(stamps)

    def far(t: float, d: float) -> bool:
        return all(t + d <= f - FAR_S or t >= c + FAR_S for f, c, _ in snapshots)

    # The last snapshot may have been cut by the end of training: only those with a full tail count.
    full = [(f, c, m) for f, c, m in snapshots if c + max(CALIBRATE_TAILS_S) + FAR_S < stamps[-1]]
    table = {}
    for tail in CALIBRATE_TAILS_S:
        excess = []
        for f, c, _ in full:
            inside = [d for t, d in steps if t + d > f and t < c + tail]
            base = [d for t, d in steps if f - AROUND_S <= t < c + AROUND_S and far(t, d)]
            if inside and base:
                excess.append(sum(inside) - len(inside) * statistics.fmean(base))
        table[tail] = excess
    return {"tails_s": list(CALIBRATE_TAILS_S), "excess_s": table, "measured_s": [m for _, _, m in full]}


def _mean_se(xs: list[float]) -> str:
    if len(xs) < 2:
        return "-"
    return f"{statistics.fmean(xs):+.3f} +- {statistics.stdev(xs) / len(xs) ** 0.5:.3f} s"


def calibration_report(r: dict, out) -> None:
    cal = r["calibration"]
    measured = [m for m in cal["measured_s"] if m is not None]
    print(f"  calibration: {len(cal['measured_s'])} snapshots every {CALIBRATE_EVERY_S} s with a full tail; "
          f"gpusnap measured {_mean_se(measured)} each", file=out)
    for tail in cal["tails_s"]:
        xs = cal["excess_s"][tail]
        print(f"    fork to commit + {tail:>2} s: excess {_mean_se(xs)} each  ({' '.join(f'{x:+.2f}' for x in xs)})", file=out)
    print("    (where the excess stops growing with the tail, the slowdown has ended: --tail-s; gpusnap's own measure "
          "is unbiased when its mean is within the errors of that excess)", file=out, flush=True)


def pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.2f}%"


def bench_size(work: str, size_gb: float, minutes: float, pairs: int, calibrate_min: float, args, threads: int, out) -> dict:
    budget = args.overhead / 100
    calibration = None
    if calibrate_min:
        cal = run_once(work, size_gb, 0, calibrate_min, False, args.overhead, threads, f"{size_gb}-calibrate",
                       every_s=CALIBRATE_EVERY_S)
        calibration_report(cal, out)
        calibration = cal["calibration"]
    runs = []
    first = run_once(work, size_gb, 0, minutes, False, budget * 100, threads, f"{size_gb}-anchor-0")
    steps = first["steps"]
    runs.append(first)
    print(f"  anchor 0: {steps} steps, training {first['train_s']:.1f} s", file=out, flush=True)
    order = []
    for i in range(pairs):
        order += [("auto", i)] if i == 0 else ([("anchor", i), ("auto", i)] if i % 2 == 0 else [("auto", i), ("anchor", i)])
    for mode, i in order:
        r = run_once(work, size_gb, steps, minutes, mode == "auto", args.overhead, threads, f"{size_gb}-{mode}-{i}",
                     tail_s=args.tail_s)
        runs.append(r)
        extra = (f", {r['snapshots']} snapshots (first {r['first_snapshot_after_s']} s into training), intervals "
                 f"{r['intervals_s']}, costs {r['costs_s']}, writes {r['write_s']} s, measured overhead "
                 f"{pct(r['measured_overhead'])} at its last cost, {pct(r['measured_run_overhead'])} over the run, "
                 f"in-run {pct(r['in_run_overhead'])} +- {pct(r['in_run_se']).lstrip('+')}") if r["auto"] else ""
        print(f"  {mode} {i}: {r['steps']} steps, training {r['train_s']:.1f} s{extra}", file=out, flush=True)
    anchors = [r["train_s"] for r in runs if not r["auto"]]
    autos = [r for r in runs if r["auto"]]
    base = statistics.fmean(anchors)
    noise = (max(anchors) - min(anchors)) / base if len(anchors) > 1 else None
    true = [r["train_s"] / base - 1 for r in autos]
    measured = [r["measured_run_overhead"] for r in autos]
    in_run = [r["in_run_overhead"] for r in autos if r["in_run_overhead"] is not None]
    median_true = statistics.median(true)
    median_in_run = statistics.median(in_run) if in_run else None
    if noise is not None and noise < budget:
        verdict = "HELD" if median_true <= budget else "NOT HELD"
    elif median_in_run is not None:
        verdict = (f"{'HELD' if median_in_run <= budget else 'NOT HELD'} (in-run; the anchors' spread "
                   f"{pct(noise)} is too wide to tell)")
    else:
        verdict = "INCONCLUSIVE"
    return {"size_gb": size_gb, "steps": steps, "anchor_train_s": anchors, "noise": noise, "true_overhead": true,
            "median_true_overhead": median_true, "measured_overhead": measured, "in_run_overhead": in_run,
            "median_in_run_overhead": median_in_run, "verdict": verdict, "runs": runs, "calibration": calibration}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.02,0.6", help="state sizes in GB, comma-separated")
    ap.add_argument("--minutes", default="4,12", help="length of the anchor run per size, comma-separated (sets the steps "
                    "of every run of that size; a large state needs runs several times its interval)")
    ap.add_argument("--pairs", default="2,1", help="auto runs per size, comma-separated (each with an anchor beside it)")
    ap.add_argument("--overhead", type=float, default=1.0, help="the budget, in percent (--overhead of gpusnap run)")
    ap.add_argument("--tail-s", type=float, default=TAIL_S, help="in-run measure: seconds after a commit that still "
                    "count as affected (what --calibrate finds)")
    ap.add_argument("--calibrate", default="0", help="minutes of a run with a snapshot every "
                    f"{CALIBRATE_EVERY_S} s before each size's runs, to see how long a snapshot slows training, "
                    "comma-separated per size (0: none)")
    ap.add_argument("--trainee-threads", default="spare", help="spare (cores - 1, as a GPU job leaves), all, or N")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    threads = _threads(args.trainee_threads)
    work = tempfile.mkdtemp(prefix="bench-overhead-", dir=args.dir)
    with open(os.path.join(work, "train.py"), "w") as f:
        f.write(PROGRAM)

    class Tee:
        def __init__(self, *streams):
            self.streams = streams

        def write(self, s):
            for st in self.streams:
                st.write(s)

        def flush(self):
            for st in self.streams:
                st.flush()

    files = [open(args.out, "w")] if args.out else []
    out = Tee(sys.stdout, *files)
    import torch

    commit = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip()
    print(f"# bench_overhead  {datetime.datetime.now().isoformat(timespec='seconds')}  code: {commit[:100]}", file=out)
    print(f"# cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load avg "
          f"{os.getloadavg()[0]:.2f}; python {platform.python_version()}, torch {torch.__version__}; "
          f"trainee threads {threads}", file=out)
    print(f"# budget --overhead {args.overhead:g}%; anchor {args.minutes} min; pairs {args.pairs}; sizes {args.sizes} GB; "
          f"in-run tail {args.tail_s:g} s; calibrate {args.calibrate} min; "
          f"knobs {' '.join(f'{k}={v}' for k, v in os.environ.items() if k.startswith('GPUSNAP_')) or 'defaults'}", file=out, flush=True)
    results = []
    started = time.monotonic()
    sizes = [float(x) for x in args.sizes.split(",")]
    minutes = [float(x) for x in args.minutes.split(",")]
    minutes += minutes[-1:] * (len(sizes) - len(minutes))
    pairs = [int(x) for x in args.pairs.split(",")]
    pairs += pairs[-1:] * (len(sizes) - len(pairs))
    calibrate_min = [float(x) for x in args.calibrate.split(",")]
    calibrate_min += calibrate_min[-1:] * (len(sizes) - len(calibrate_min))
    for size, length, n, cal_min in zip(sizes, minutes, pairs, calibrate_min):
        print(f"\n== state {size:g} GB, anchor {length:g} min, {n} auto run{'s' if n > 1 else ''} ==", file=out, flush=True)
        r = bench_size(work, size, length, n, cal_min, args, threads, out)
        results.append(r)
        print(f"  anchors: {', '.join(f'{t:.1f}' for t in r['anchor_train_s'])} s (spread {pct(r['noise'])}); "
              f"auto true overhead {', '.join(pct(x) for x in r['true_overhead'])} (median {pct(r['median_true_overhead'])}); "
              f"gpusnap measured {', '.join(pct(x) for x in r['measured_overhead'])}; in-run "
              f"{', '.join(pct(x) for x in r['in_run_overhead'])}; budget {args.overhead:g}% -> {r['verdict']}",
              file=out, flush=True)
    print("\n== summary ==", file=out)
    print(f"{'size GB':>8} {'steps':>6} {'interval s (chosen)':>22} {'snaps':>6} {'cost s (mean)':>14} "
          f"{'true ovh':>9} {'noise':>8} {'in-run':>8} {'measured':>9}  verdict", file=out)
    for r in results:
        autos = [x for x in r["runs"] if x["auto"]]
        intervals = [i for x in autos for i in x["intervals_s"] if i is not None]
        costs = [c for x in autos for c in x["costs_s"]]
        span = f"{min(intervals):.0f}-{max(intervals):.0f}" if intervals else "-"
        print(f"{r['size_gb']:>8g} {r['steps']:>6} {span:>22} {statistics.fmean([x['snapshots'] for x in autos]):>6.1f} "
              f"{(statistics.fmean(costs) if costs else float('nan')):>14.3f} {pct(r['median_true_overhead']):>9} "
              f"{pct(r['noise']):>8} {pct(r['median_in_run_overhead']):>8} "
              f"{pct(statistics.median(r['measured_overhead']) if r['measured_overhead'] else None):>9}  "
              f"{r['verdict']}", file=out)
    print(f"(total {time.monotonic() - started:.0f} s; true ovh: median over the auto runs of training time / mean of the "
          f"anchors' - 1; noise: spread of the anchors; in-run: median of the in-run overhead (from each fork to --tail-s "
          f"after its commit, against local baselines); measured: what gpusnap measured itself)", file=out)
    print("# raw " + json.dumps(results), file=out)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
