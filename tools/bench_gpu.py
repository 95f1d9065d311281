"""What a gpusnap snapshot costs a GPU training run, against the anchors measured in the same run:
synchronous torch.save, DCP async_save's blocking time, and a plain pinned device->host copy of
the same bytes. Needs one CUDA GPU.

    python tools/bench_gpu.py [--sizes 1,8] [--snapshots 3] [--repeats 2]
                              [--parts stall,frozen,throughput,restart,expandable,queued]
                              [--every 60] [--throughput-s 150] [--dir DIR] [--out FILE] [--dry-run]

Before each size, a preflight: free disk under DIR (torch.save's file, DCP's directory and the
runs' snapshots, one at a time: about 2.5 times the state), host memory (the pinned anchor copy,
the staging arena, the trainee: 4 times) and free GPU memory (the state and a buffer of its size
for the merged-copy anchor: 2.2 times); a size that does not fit is skipped with a line saying
what is short. --dry-run prints the plan and the preflight and stops (no GPU needed).

For each size S (GB of model + Adam state on cuda:0; tools/bench_gpu_program.py builds it):

- anchors (a plain python process): torch.save + fsync; dcp.async_save blocking / total; the
  state's bytes copied into pinned host memory tensor by tensor, and as one copy of one buffer
  of the same size (merged ranges against per-tensor copies); cuMemHostRegister's cost and
  fork() with the registered arena mapped, and the arena's VmFlags (no "dc": fork passes it on);
- stall: the program under `gpusnap run`; SIGUSR1 --snapshots times, each after the last one
  committed; every step changes every byte (Adam), so each snapshot copies all of the state.
  The stall is the trainee's, safe point to fork (``forked`` in DIR/log.jsonl). Goal: within
  1.1x the pinned per-tensor copy;
- frozen: the same with 90% of the layers frozen (requires_grad False, no Adam state): from the
  second snapshot on their chunks are clean. Goal: stall within 15% of the all-dirty stall;
- throughput: steps per second over --throughput-s with `--every` (a snapshot a minute) against
  the same program without gpusnap. Goal: >= 99%;
- restart: the last stall run killed -9 and restarted: replay, fast-forward, reading chunks,
  decoding them, checking them, and the merge's host->device copies (the merge less loading);
- expandable: the stall with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
- queued: the stall when the step leaves ~60 ms of kernels queued at the boundary (staging
  waits for them: the stall includes them, and the bytes are the ones after them).

Every figure is printed with its ratio to the anchors of the same size, and the whole output,
with the GPU, driver, CUDA, torch and the commit, goes to --out (default
tools/results/bench_gpu-<gpu>-<date>.txt).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from common import read_json, wait_for

TOOLS = pathlib.Path(__file__).resolve().parent
REPO = TOOLS.parent
PROGRAM = TOOLS / "bench_gpu_program.py"
PARTS = ("stall", "frozen", "throughput", "restart", "expandable", "queued")


class Report:
    def __init__(self, path: pathlib.Path):
        self.path = path
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(self.lines) + "\n")


def environment() -> dict:
    def run(*cmd) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except OSError:
            return "?"

    probe = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
    return {
        "gpu": run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"),
        "torch_cuda_gpu": run(sys.executable, "-c", probe),
        "commit": os.environ.get("GPUSNAP_COMMIT") or run("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"),
        "python": sys.version.split()[0],
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def events(run_dir: pathlib.Path, name: str) -> list[dict]:
    try:
        lines = (run_dir / "log.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == name:
            found.append(ev)
    return found


def gpusnap(*args, env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpusnap", *map(str, args)], env={**os.environ, **(env or {})},
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def steps_done(stamps: pathlib.Path) -> int:
    try:
        return len(stamps.read_text().splitlines())
    except OSError:
        return 0


def snapshot_run(work: pathlib.Path, gb: float, count: int, frozen: float = 0.0, env=None, queued: bool = False,
                 keep_dir: bool = False) -> dict:
    """``count`` snapshots of the program under `gpusnap run`; their stalls, dirty bytes, sizes."""
    run_dir, stamps, stop = work / "run", work / "stamps", work / "stop"
    args = ["train", gb, frozen, stamps, stop] + (["--queued"] if queued else [])
    # One snapshot kept: the disk holds at most two while the next one commits.
    proc = gpusnap("run", "--keep", "1", "--dir", run_dir, PROGRAM, *args, env=env, cwd=work)
    result = {"stall_s": [], "dirty_bytes": [], "bytes_written": [], "write_s": []}
    try:
        wait_for(lambda: steps_done(stamps) >= 5, "five training steps", proc=proc, timeout=900)
        for k in range(count):
            before = len(events(run_dir, "committed"))
            os.kill(proc.pid, signal.SIGUSR1)
            wait_for(lambda: len(events(run_dir, "committed")) > before or events(run_dir, "failed"),
                     f"snapshot {k + 1}", proc=proc, timeout=1800)
            if events(run_dir, "failed"):
                raise RuntimeError(f"a snapshot failed: {events(run_dir, 'failed')[-1]}")
            done = events(run_dir, "committed")[-1]
            manifest = read_json(run_dir / "snapshots" / f"{done['id']}.json") or {}
            result["stall_s"].append(done["stall_s"])
            result["write_s"].append(done["write_s"])
            result["bytes_written"].append(done["bytes_written"])
            result["dirty_bytes"].append((manifest.get("device") or {}).get("dirty_bytes"))
            at = steps_done(stamps)
            wait_for(lambda: steps_done(stamps) >= at + 3, "three steps after the commit", proc=proc)
    finally:
        if keep_dir:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            stop.touch()
        proc.wait(timeout=600)
    return result


def restart_run(work: pathlib.Path) -> dict:
    run_dir, stop = work / "run", work / "stop"
    stop.unlink(missing_ok=True)
    t = time.perf_counter()
    proc = gpusnap("restart", run_dir, cwd=work)
    restored = wait_for(lambda: events(run_dir, "restored"), "the restore", proc=proc, timeout=1800)[-1]
    wall = time.perf_counter() - t
    stop.touch()
    proc.wait(timeout=600)
    return {**restored, "wall_s": wall}


def throughput(work: pathlib.Path, gb: float, seconds: float, every: int) -> dict:
    rates = {}
    for mode in ("plain", "gpusnap"):
        stamps, stop = work / f"stamps-{mode}", work / f"stop-{mode}"
        args = ["train", gb, 0.0, stamps, stop]
        if mode == "plain":
            proc = subprocess.Popen([sys.executable, PROGRAM, *map(str, args)], cwd=work)
        else:
            proc = gpusnap("run", "--every", f"{every}s", "--dir", work / "run-every", PROGRAM, *args, cwd=work)
        wait_for(lambda: steps_done(stamps) >= 5, "five steps", proc=proc, timeout=900)
        start_steps, t = steps_done(stamps), time.perf_counter()
        time.sleep(seconds)
        rates[mode] = (steps_done(stamps) - start_steps) / (time.perf_counter() - t)
        stop.touch()
        proc.wait(timeout=600)
    rates["snapshots"] = len(events(work / "run-every", "committed"))
    return rates


def med(values) -> float:
    return statistics.median(values)


def gpu_free_bytes() -> int | None:
    """Free memory of GPU 0 as nvidia-smi reports it; None where it cannot say."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=60)
        return int(done.stdout.split()[0]) << 20
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def preflight(gb: float, scratch: pathlib.Path) -> str | None:
    """What is short for a run of ``gb`` GB, or None when disk, host memory and GPU memory suffice."""
    import psutil

    state = gb * 1e9
    short = []
    disk = shutil.disk_usage(scratch).free
    if disk < 2.5 * state + 2e9:
        short.append(f"disk under {scratch}: {disk / 1e9:.1f} GB free, {(2.5 * state + 2e9) / 1e9:.1f} needed")
    memory = psutil.virtual_memory().available
    if memory < 4 * state + 4e9:
        short.append(f"host memory: {memory / 1e9:.1f} GB available, {(4 * state + 4e9) / 1e9:.1f} needed")
    gpu = gpu_free_bytes()
    if gpu is not None and gpu < 2.2 * state + 1e9:
        short.append(f"GPU memory: {gpu / 1e9:.1f} GB free, {(2.2 * state + 1e9) / 1e9:.1f} needed")
    return "; ".join(short) or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8")
    parser.add_argument("--snapshots", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--every", type=int, default=60)
    parser.add_argument("--throughput-s", type=float, default=150)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the preflight, run nothing")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    env = environment()
    gpu = (env["gpu"].split(",")[0] or "gpu").strip().replace(" ", "-")
    out = pathlib.Path(args.out or REPO / "tools" / "results" / f"bench_gpu-{gpu}-{datetime.date.today()}.txt")
    report = Report(out)
    report.say(f"# {' '.join(sys.argv)}")
    for key, value in env.items():
        report.say(f"# {key}: {value}")
    scratch = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bench-gpu-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        for gb in (float(s) for s in args.sizes.split(",")):
            work = scratch / f"{gb:g}GB"
            short = preflight(gb, scratch)
            report.say(f"\n## {gb:g} GB of model + Adam state: parts {', '.join(p for p in PARTS if p in parts)}; "
                       f"preflight {'ok' if short is None else 'SHORT: ' + short}")
            if short is not None or args.dry_run:
                report.say(f"  {'skipped' if short else 'dry run: nothing run'}")
                continue
            work.mkdir(parents=True, exist_ok=True)
            anchor_out = subprocess.run([sys.executable, PROGRAM, "anchors", gb, work, args.repeats],
                                        capture_output=True, text=True, check=True).stdout
            a = json.loads(anchor_out.strip().splitlines()[-1])
            state_gb = a["state_bytes"] / 1e9
            copy_s = med(a["pinned_copy_s"])
            report.say(f"state {state_gb:.2f} GB in {a['tensors']} tensors on {a['gpu']} (torch {a['torch']}, CUDA {a['cuda']})")
            report.say(f"  torch.save + fsync           {med(a['torch_save_s']):8.3f} s")
            report.say(f"  dcp.async_save blocking      {med(a['dcp_async_block_s']):8.3f} s  (until done {med(a['dcp_async_total_s']):.3f} s)")
            report.say(f"  pinned copy, per tensor      {copy_s:8.3f} s  {state_gb / copy_s:6.1f} GB/s")
            report.say(f"  pinned copy, one buffer      {med(a['merged_copy_s']):8.3f} s  {state_gb / med(a['merged_copy_s']):6.1f} GB/s")
            report.say(f"  cuMemHostRegister            {a['register_s']:8.3f} s for {a['register_bytes'] / 1e9:.2f} GB "
                       f"({a['register_bytes'] / 1e9 / a['register_s']:.1f} GB/s); fork with it mapped {med(a['fork_s']) * 1e3:.1f} ms; "
                       f"arena VmFlags: {a['arena_vmflags']}")
            stalls = None
            if "stall" in parts or "restart" in parts:
                stalls = snapshot_run(work / "stall", gb, args.snapshots, keep_dir="restart" in parts)
                for k, (stall, dirty) in enumerate(zip(stalls["stall_s"], stalls["dirty_bytes"]), 1):
                    report.say(f"  gpusnap snapshot {k}: stall {stall:.3f} s = {stall / copy_s:.2f}x the pinned copy, "
                               f"{stall / med(a['torch_save_s']):.3f}x torch.save, "
                               f"{stall / med(a['dcp_async_block_s']):.2f}x dcp.async_save's blocking; "
                               f"dirty {(dirty or 0) / 1e9:.2f} GB, wrote {stalls['bytes_written'][k - 1] / 1e9:.2f} GB "
                               f"in {stalls['write_s'][k - 1]:.1f} s")
                # The first snapshot of a process also compiles the kernel and registers the arena: once.
                later = stalls["stall_s"][1:] or stalls["stall_s"]
                worst = max(later)
                report.say(f"  goal stall <= 1.1x the pinned copy: largest after the first {worst / copy_s:.2f}x -> "
                           f"{'MET' if worst <= 1.1 * copy_s else 'NOT MET'}")
            if "restart" in parts and stalls is not None:
                r = restart_run(work / "stall")
                report.say(f"  restart: wall {r['wall_s']:.2f} s = replay {r['replay_s']:.2f} + fast-forward {r['fastforward_s']:.2f} "
                           f"+ merge {r['merge_s']:.2f} s (of which loading {r.get('load_s', 0):.2f}: read {r.get('read_s', 0):.2f}, "
                           f"decode {r.get('decode_s', 0):.2f}, check {r.get('check_s', 0):.2f}; host->device and the rest "
                           f"{r['merge_s'] - r.get('load_s', 0):.2f}) for {r.get('nbytes', 0) / 1e9:.2f} GB read")
                shutil.rmtree(work / "stall", ignore_errors=True)  # the disk for the next part
            if "frozen" in parts:
                frozen = snapshot_run(work / "frozen", gb, max(2, args.snapshots), frozen=0.9)
                later = med(frozen["stall_s"][1:])
                base = med(stalls["stall_s"]) if stalls else copy_s
                report.say(f"  90% frozen: stalls {', '.join(f'{s:.3f}' for s in frozen['stall_s'])} s; later ones "
                           f"{later / base:.1%} of the all-dirty stall -> {'MET' if later <= 0.15 * base else 'NOT MET'} (goal <= 15%)")
            if "expandable" in parts:
                ex = snapshot_run(work / "expandable", gb, 2, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
                report.say(f"  expandable segments: stalls {', '.join(f'{s:.3f}' for s in ex['stall_s'])} s "
                           f"({med(ex['stall_s']) / copy_s:.2f}x the pinned copy)")
            if "queued" in parts:
                q = snapshot_run(work / "queued", gb, 2, queued=True)
                report.say(f"  with ~60 ms of kernels queued at the boundary: stalls {', '.join(f'{s:.3f}' for s in q['stall_s'])} s")
            if "throughput" in parts:
                t = throughput(work, gb, args.throughput_s, args.every)
                ratio = t["gpusnap"] / t["plain"]
                report.say(f"  throughput with a snapshot every {args.every} s ({t['snapshots']} taken): {t['gpusnap']:.2f} "
                           f"steps/s against {t['plain']:.2f} without: {ratio:.1%} -> {'MET' if ratio >= 0.99 else 'NOT MET'} (goal >= 99%)")
            shutil.rmtree(work, ignore_errors=True)
            report.save()
    finally:
        report.save()
        print(f"written to {out}")


if __name__ == "__main__":
    main()
