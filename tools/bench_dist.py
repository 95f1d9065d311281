"""What a global gpusnap snapshot costs a torchrun job, against DCP async_save of the same
state on the same ranks, in one run.

    python tools/bench_dist.py [--ranks 2,4] [--mb 32] [--steps 60] [--snap-at 15,35]
                               [--dir /tmp/bench-dist] [--result FILE] [--reuse]

The job: DDP over gloo on CPU, one rank per process, an MLP of square fp32 Linear layers of
--mb MB of parameters per rank (so 3x that with AdamW's state), AdamW, small batches, every
step touches every parameter. Three runs per rank count, each under torchrun:

  baseline   the job alone
  dcp        at each --snap-at step, after the optimizer step: wait for the previous
             async_save's future, then dcp.async_save({"model", "optim"} state dicts) into a new
             checkpoint directory; its blocking time is the stall
  gpusnap    the same job under `gpusnap run --nproc-per-node N`, the program calling
             gpusnap.snapshot() at the same steps (the ranks agree on an iteration DIST_MARGIN
             steps later); the stall is each rank's `forked` stall_s (safe point to fork)

and, for N > 1, gpusnap on one rank with N times the parameters: the same total bytes written
by one process, whose time to durable (``durable_s``: safe point to commit, the slowest
shard's for a job) the N ranks' writers, sharing the node's cores, are held against.

Every rank stamps each step's duration. The extra time is the sum over all steps of (step -
the baseline run's median step), the total cost of the snapshots
(stall, copy-on-write faults, the writer's or DCP's background threads' CPU); beside it, the
same against the run's own median step (robust to a machine whose load changes between runs,
blind to a cost that every step pays, such as writers competing for the cores); stall per
snapshot is the largest over ranks, averaged over snapshots. On the 2-core CI machine 4 ranks
oversubscribe the cores: the figures are relative, measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def train(mode: str, out: str, mb: int, steps: int, snap_at: list[int]) -> None:
    """One rank of the job (run by torchrun)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    width = 1024
    layers = max(1, (mb << 20) // (4 * width * width))
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, width)
    stamps, stalls, pending = [], [], None
    # DCP's async_save finishes with collectives from its own thread: on the training group
    # they would interleave with DDP's all-reduces (a hang), so it gets a group of its own.
    ckpt_group = dist.new_group(backend="gloo") if mode == "dcp" else None
    if mode == "gpusnap":
        import gpusnap
    for step in range(steps):
        started = time.perf_counter()
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step in snap_at:
            if mode == "dcp":
                import torch.distributed.checkpoint as dcp

                t0 = time.perf_counter()
                if pending is not None:
                    pending.result()
                state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
                pending = dcp.async_save(state, checkpoint_id=os.path.join(out, "dcp", f"step{step}"), process_group=ckpt_group)
                stalls.append(time.perf_counter() - t0)
            elif mode == "gpusnap":
                gpusnap.snapshot()
        stamps.append(time.perf_counter() - started)
    if pending is not None:
        pending.result()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": stamps, "stalls": stalls}, f)
    dist.destroy_process_group()


def _run(mode: str, ranks: int, args, work: Path, mb: int | None = None) -> dict:
    mb = mb or args.mb
    out = work / f"{mode}-{ranks}" if mb == args.mb else work / f"{mode}-{ranks}-{mb}mb"
    if args.reuse:  # report again from the files an earlier run left in --dir
        return _read(mode, ranks, out, None)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    program = [str(Path(__file__).resolve()), "--train", mode, "--out", str(out), "--mb", str(mb),
               "--steps", str(args.steps), "--snap-at", args.snap_at]
    if mode == "gpusnap":
        cmd = [sys.executable, "-m", "gpusnap", "run", "-q", "--nproc-per-node", str(ranks), "--dir", str(out / "run"), *program]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *program]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{mode} with {ranks} ranks failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return _read(mode, ranks, out, time.perf_counter() - started)


def _read(mode: str, ranks: int, out: Path, wall_s: float | None) -> dict:
    result = {"wall_s": wall_s, "ranks": []}
    for r in range(ranks):
        result["ranks"].append(json.loads((out / f"rank{r}.json").read_text()))
    if mode == "gpusnap":
        log = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines()]
        forked: dict[str, list[float]] = {}
        for e in log:
            if e.get("event") == "forked":
                forked.setdefault(e["id"], []).append(e["stall_s"])
        result["snap_stalls"] = [max(v) for _, v in sorted(forked.items())]
        result["committed"] = sorted({e["id"] for e in log if e.get("event") == "committed"})
        result["write_s"] = [e.get("write_s") for e in log if e.get("event") == "committed" and e.get("rank") == 0]
        result["durable_s"] = [e.get("durable_s") for e in log if e.get("event") == "committed" and e.get("rank") == 0]
    else:
        stalls = [r["stalls"] for r in result["ranks"]]
        result["snap_stalls"] = [max(s[i] for s in stalls) for i in range(len(stalls[0]))] if stalls and stalls[0] else []
    return result


def _extra(run: dict, base: float | None = None) -> float:
    """Largest over ranks of the summed step time beyond the baseline run's median step (or,
    without ``base``, beyond that rank's own median in the same run: blind to a slowdown of
    every step, such as a writer that competes for the cores through the whole run)."""
    return max(sum(s - (base if base is not None else statistics.median(r["steps"][5:])) for s in r["steps"])
               for r in run["ranks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--mb", type=int, default=32, help="MB of parameters per rank (AdamW adds twice that)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--snap-at", default="15,35", help="steps after which a snapshot / async_save is asked for")
    ap.add_argument("--dir", default="/tmp/bench-dist")
    ap.add_argument("--result", help="also write the report to this file")
    ap.add_argument("--reuse", action="store_true", help="report from the runs an earlier call left in --dir")
    ap.add_argument("--no-single", action="store_true",
                    help="skip the one-process run with every rank's bytes (time to durable's anchor)")
    args = ap.parse_args()
    snap_at = [int(s) for s in args.snap_at.split(",") if s]
    if args.train:
        train(args.train, args.out, args.mb, args.steps, snap_at)
        return
    import torch

    work = Path(args.dir)
    lines = [f"bench_dist: torch {torch.__version__}, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.2f}, {args.mb} MB of "
             f"parameters per rank ({3 * args.mb} MB with AdamW state), {args.steps} steps, snapshots after steps {snap_at}"]
    for ranks in [int(r) for r in args.ranks.split(",")]:
        runs = {mode: _run(mode, ranks, args, work) for mode in ("baseline", "dcp", "gpusnap")}
        base = statistics.median(s for r in runs["baseline"]["ranks"] for s in r["steps"][5:])
        lines.append(f"{ranks} ranks: baseline step {base * 1000:.1f} ms (median over ranks and steps)")
        for mode in ("dcp", "gpusnap"):
            run = runs[mode]
            stalls = run["snap_stalls"]
            n = max(1, len(snap_at))
            extra, own = _extra(run, base), _extra(run)
            what = "DCP async_save" if mode == "dcp" else "gpusnap       "
            lines.append(f"  {what}  stall per snapshot {statistics.mean(stalls) * 1000 if stalls else float('nan'):8.1f} ms "
                         f"(max over ranks; {len(stalls)} taken)   extra time per request {extra / n * 1000:8.1f} ms "
                         f"(against its own median step: {own / n * 1000:.1f} ms)"
                         + (f"   committed {run['committed']}, rank 0 write {[round(w, 2) for w in run['write_s']]} s"
                            if mode == "gpusnap" else ""))
        d, g = runs["dcp"], runs["gpusnap"]
        if d["snap_stalls"] and g["snap_stalls"]:
            ratio = f"{_extra(g, base) / _extra(d, base):.2f}x" if _extra(d, base) > 0 else "n/a (DCP's is within the noise)"
            lines.append(f"  ratio gpusnap/DCP: stall {statistics.mean(g['snap_stalls']) / statistics.mean(d['snap_stalls']):.2f}x, "
                         f"extra time {ratio} (goal <= 1x)")
        if ranks > 1 and not args.no_single:
            # The same total bytes written by one process: what the ranks' writers, sharing the
            # node's cores, are held against.
            one = _run("gpusnap", 1, args, work, mb=args.mb * ranks)
            mine = [x for x in g.get("durable_s") or [] if x]
            alone = [x for x in one.get("durable_s") or [] if x]
            if mine and alone:
                r = statistics.mean(mine) / statistics.mean(alone)
                lines.append(f"  time to durable: {ranks} ranks {statistics.mean(mine):.2f} s, one process with {args.mb * ranks} MB of "
                             f"parameters {statistics.mean(alone):.2f} s: {r:.2f}x -> {'MET' if r <= 1.5 else 'NOT MET'} (goal <= 1.5x)")
    report = "\n".join(lines)
    print(report)
    if args.result:
        Path(args.result).write_text(report + "\n")


if __name__ == "__main__":
    main()
