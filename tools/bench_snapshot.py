"""What a gpusnap snapshot costs a CPU training run, against torch.save and
torch.distributed.checkpoint (DCP) save / async_save of the same state, in one run.

    python tools/bench_snapshot.py [--sizes 0.5,1.5,4] [--quick] [--snapshots 3] [--repeats 3]
                                   [--settings tuned|default] [--stop]
                                   [--trainee-threads spare|all|N] [--malloc fixed|glibc]
                                   [--dir /work/bench-tmp] [--out FILE]

For each size S (GB = 1e9 bytes of model + Adam state): an MLP of square fp32 Linear layers
whose parameters are S/3 bytes, trained with torch.optim.Adam on small batches (every step
touches every parameter, exp_avg and exp_avg_sq; grads are set to None after the step, so the
state at a loop boundary is exactly params + Adam state, as in the anchors' state_dicts).

1. Anchors, in a plain `python` process that builds the same state after a few steps (median of
   --repeats, output deleted between runs): torch.save(...) + fsync; dcp.save(state_dict,
   checkpoint_id=dir) (single process, no process group); dcp.async_save: blocking time and
   time until its future completes. The same process also measures the copy-on-write cost
   alone: training steps while an idle forked child holds the whole image (no writer CPU).
2. gpusnap: the same program under `gpusnap run`, stamping every step's start time into a file.
   After warm-up, SIGUSR1 to the supervisor, wait for `committed` in log.jsonl, let it train on,
   repeat (--snapshots); the first snapshot writes everything, later ones show the incremental
   cost. A stop file ends the program. From the step stamps:
     baseline step   median of steps that overlap no write (warm-up and the first steps after
                     each commit excluded)
     stall           `forked` stall_s from the log (safe point to fork returned, in the trainee);
                     the summary's is the largest of the run, the first snapshot included
                     (it lands while the trainee's preparation thread is at work)
     drain           the writer's first act: large CPU tensors copied to the staging pool and
                     its copy-on-write mapping of them dropped (bytes: how much)
     extra wall      sum over steps overlapping [signal, commit] plus the next TAIL_STEPS steps
                     (re-fault of pages shared with the exited writer) of (step - baseline);
                     a step stamp is taken at the top of the loop body, so the stall, which
                     happens at the loop boundary, falls inside one of these steps
     durable         `durable_s` from the log: safe point to commit; against the store alone on
                     the same state (issue 26: <= 1.5x with a core left idle)
With --stop, each run ends with SIGTERM instead of a stop file: a stop snapshot, whose fork to
commit (its `write_s`) is set against the disk's sequential write bandwidth, measured dd-style
(16 MiB blocks, fsync'd, O_DIRECT where the file system takes it and through the page cache;
the faster counts) in the same directory just before (issue 26: <= 1.25x bytes written / that).
Targets (from the issue): stall <= 5% of torch.save; extra wall <= 50% of torch.save.

Settings: ``tuned`` (default) is ``--trainee-threads spare --malloc fixed`` below; ``default`` is
what a program gets without tuning: ``--trainee-threads all --malloc glibc`` (either flag given
explicitly wins). Under ``default`` on the 2-core CI machine, training leaves the writer no core:
each write takes minutes, so keep --sizes and --snapshots small.

Trainee threads (torch.set_num_threads, anchors and gpusnap alike): ``spare`` (default) leaves
one core to the writer, as a GPU training process does (its host thread drives the device; a
GPU node has cores to spare); ``all`` gives every core to training, so that every CPU-second
the writer spends (hashing, compression) comes out of training whatever its priority: on the
2-core CI machine even an idle-priority busy loop slows a 2-thread trainee by ~19%.

Malloc (anchors and gpusnap alike): ``fixed`` (default) pins glibc's thresholds
(MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_=4 GiB). With glibc's own dynamic
thresholds (``glibc``), whether a step's 16 MiB gradients and temporaries come from the heap or
from fresh mmaps changes from step to step, and with it ~120,000 page faults: at 0.5 GB the step
time jumps between 0.41 and 0.65 s, which drowns a snapshot's cost in the baseline. Fixed, the
step is stable (0.41 +- 0.01 s), and the heap's free pages, shared with the writer by fork like
every other page, are part of what is measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from common import MLP, Tee, read_json, wait_for

GB = 1e9
TAIL_STEPS = 2  # steps after a commit counted into extra wall (and kept out of the baseline)
WARMUP_STEPS = 3  # steps never used for the baseline (allocator, first Adam state)
PRE_STEPS = 4  # quiet steps before the first snapshot
POST_STEPS = 4  # steps after a commit before the next request (>= TAIL_STEPS + 2)

# The program under test; also the anchor runner (mode "anchors"). Written into the temp dir.
PROGRAM = textwrap.dedent(
    '''
    import json, os, shutil, signal, statistics, sys, time
    import torch

    {MLP}
    def dir_bytes(path):
        if os.path.isfile(path):
            return os.path.getsize(path)
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)

    def fsync_path(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    mode = sys.argv[1]
    state_bytes = float(sys.argv[2])
    torch.set_num_threads(int(os.environ["BENCH_TRAINEE_THREADS"]))
    model, opt, x, width, depth = build(state_bytes)

    if mode == "train":
        stamps_path, stop_path, deadline = sys.argv[3], sys.argv[4], float(sys.argv[5])
        stamps = open(stamps_path, "w")
        for it in range(1_000_000):
            stamps.write(f"{time.time():.6f}\\n")
            stamps.flush()
            if os.path.exists(stop_path) or time.time() > deadline:
                break
            step(model, opt, x)
        stamps.close()
        sys.exit(0)

    # mode == "anchors"
    out_dir, repeats, warm = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    import torch.distributed.checkpoint as dcp
    import warnings
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    for _ in range(warm):
        step(model, opt, x)
    result = {"width": width, "depth": depth,
              "state_bytes": sum(p.numel() * 4 * 3 for p in model.parameters()),
              "torch_version": torch.__version__, "threads": torch.get_num_threads()}
    times = []
    for _ in range(3):
        t = time.perf_counter(); step(model, opt, x); times.append(time.perf_counter() - t)
    result["step_s"] = statistics.median(times)

    def sd():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    path = os.path.join(out_dir, "torch_save.pt")
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(sd(), f)
            f.flush()
            os.fsync(f.fileno())
        runs.append(time.perf_counter() - t)
        result["torch_save_bytes"] = dir_bytes(path)
        os.remove(path)
    result["torch_save_s"] = runs

    path = os.path.join(out_dir, "dcp_save")
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        dcp.save(sd(), checkpoint_id=path)  # FileSystemWriter fsyncs its files (sync_files=True)
        runs.append(time.perf_counter() - t)
        result["dcp_save_bytes"] = dir_bytes(path)
        shutil.rmtree(path)
    result["dcp_save_s"] = runs

    path = os.path.join(out_dir, "dcp_async")
    block, total = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        fut = dcp.async_save(sd(), checkpoint_id=path)
        t1 = time.perf_counter()
        fut.result()
        t2 = time.perf_counter()
        block.append(t1 - t); total.append(t2 - t)
        result["dcp_async_bytes"] = dir_bytes(path)
        shutil.rmtree(path)
        del fut
    result["dcp_async_block_s"], result["dcp_async_total_s"] = block, total

    # Copy-on-write alone: steps while an idle child holds the forked image, then without it.
    def steps(n):
        out = []
        for _ in range(n):
            t = time.perf_counter(); step(model, opt, x); out.append(time.perf_counter() - t)
        return out
    before = steps(2)
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    result["fork_s"] = time.perf_counter() - t
    during = steps(3)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    after = steps(3)
    result["cow"] = {"before": before, "during_fork": during, "after_child_exit": after}

    # gpusnap's store alone on the same tensors: no fork, no training beside it.
    from gpusnap.store import RunDir
    path = os.path.join(out_dir, "store")
    rd = RunDir.create(path, {"command": {"kind": "script", "target": "bench.py", "args": []}})
    t = time.perf_counter()
    w = rd.begin_snapshot("000001")
    recs = {}
    tensors = [p.detach() for p in model.parameters()]
    tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    for i, tensor in enumerate(tensors):
        recs[f"t{i}"] = w.put_buffer(memoryview(tensor.numpy()).cast("B"), dtype="float32", typesize=4)
    w.commit({"buffers": recs})
    st = w.stats
    result["store"] = {"wall_s": time.perf_counter() - t, "hash_s": st.hash_s, "compress_s": st.compress_s,
                       "io_s": st.io_s, "bytes_total": st.bytes_total, "bytes_written": st.bytes_written}
    shutil.rmtree(path)
    print("ANCHORS " + json.dumps(result), flush=True)
    '''
).replace("{MLP}\n", MLP + "\n")


def sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return "?"


def environment(args, say) -> None:
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = sh(f"git -C {root} rev-parse --short HEAD")
    dirty = sh(f"git -C {root} status --porcelain --untracked-files=no")
    knobs = {k: v for k, v in os.environ.items() if k.startswith("GPUSNAP_")}
    say(f"# bench_snapshot  {datetime.datetime.now().isoformat(timespec='seconds')}")
    say(f"# cpu: {cpu}, {os.cpu_count()} cores; ram {mem / 2**30:.1f} GiB; load avg {os.getloadavg()[0]:.2f}")
    say(f"# python {platform.python_version()}, torch {torch.__version__} "
        f"(trainee threads {os.environ['BENCH_TRAINEE_THREADS']} of {os.cpu_count()}: {args.trainee_threads}), "
        f"blosc2 {_version('blosc2')}, gpusnap {commit}{' (dirty)' if dirty else ''}; malloc {args.malloc}")
    say(f"# disk: {os.path.abspath(args.dir)} ({sh(f'df -h --output=source,fstype,avail {args.dir} | tail -1')}); "
        f"THP {sh('cat /sys/kernel/mm/transparent_hugepage/enabled')}")
    say(f"# settings {args.settings}; sizes {args.sizes} GB; anchors x{args.repeats}; gpusnap snapshots per size {args.snapshots}; "
        f"knobs {knobs or 'defaults'}")


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:
        return "?"


def read_log(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def read_stamps(path: str) -> list[float]:
    with open(path) as f:
        return [float(x) for x in f.read().split()]


def run_anchors(prog: str, size_gb: float, work: str, args) -> dict:
    out = os.path.join(work, "anchors")
    os.makedirs(out, exist_ok=True)
    p = subprocess.run(
        [sys.executable, prog, "anchors", str(size_gb * GB), out, str(args.repeats), str(WARMUP_STEPS)],
        capture_output=True, text=True, timeout=1800,
    )
    shutil.rmtree(out, ignore_errors=True)
    for line in p.stdout.splitlines():
        if line.startswith("ANCHORS "):
            return json.loads(line[8:])
    raise RuntimeError(f"anchor process failed ({p.returncode}):\n{p.stderr[-3000:]}")


def disk_bandwidth(directory: str, nbytes: int) -> dict:
    """dd-style sequential writes of ``nbytes`` in 16 MiB blocks, fsync'd, in ``directory``: with
    O_DIRECT (as gpusnap writes packs; where the file system takes it) and through the page
    cache. Bytes per second of each; ``bps`` is the faster."""
    import mmap

    block = mmap.mmap(-1, 16 << 20)  # page-aligned, as O_DIRECT needs
    block.write(os.urandom(1 << 20) * 16)
    out = {}
    for name, flags in (("direct", getattr(os, "O_DIRECT", 0)), ("buffered", 0)):
        path = os.path.join(directory, f"dd-{name}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
        except OSError:
            continue  # tmpfs refuses O_DIRECT
        try:
            t = time.perf_counter()
            for _ in range(max(1, nbytes // len(block))):
                os.write(fd, block)
            os.fsync(fd)
            out[name] = max(1, nbytes // len(block)) * len(block) / (time.perf_counter() - t)
        except OSError:
            pass
        finally:
            os.close(fd)
            os.unlink(path)
    out["bps"] = max(v for k, v in out.items())
    return out


def run_gpusnap(prog: str, size_gb: float, work: str, args, say) -> dict:
    rd = os.path.join(work, "run")
    stamps_path, stop_path = os.path.join(work, "stamps.txt"), os.path.join(work, "stop")
    log_path = os.path.join(rd, "log.jsonl")
    out = open(os.path.join(work, "gpusnap.out"), "w")
    deadline = time.time() + 1500
    disk = None
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpusnap", "run", "--dir", rd, "--resume", "never", prog, "train", str(size_gb * GB), stamps_path,
         stop_path, str(deadline)],
        stdout=out, stderr=subprocess.STDOUT, cwd=work,
    )
    requests = []
    try:
        sup = wait_for(lambda: read_json(os.path.join(rd, "supervisor.json")), "supervisor.json", proc, 120)
        nstamps = lambda: len(read_stamps(stamps_path)) if os.path.exists(stamps_path) else 0  # noqa: E731
        wait_for(lambda: nstamps() >= WARMUP_STEPS + PRE_STEPS + 1, "warm-up steps", proc, 900)
        for k in range(args.snapshots):
            done_before = {e.get("id") for e in read_log(log_path) if e.get("event") in ("committed", "failed", "skipped")}
            t_req = time.time()
            os.kill(sup["pid"], signal.SIGUSR1)
            ev = wait_for(
                lambda: next((e for e in read_log(log_path) if e.get("event") in ("committed", "failed", "skipped")
                              and e.get("id") not in done_before), None),
                f"commit of snapshot {k + 1}", proc, 900,
            )
            if ev["event"] != "committed":
                raise RuntimeError(f"snapshot {k + 1}: {ev}")
            requests.append(t_req)
            n = nstamps()
            wait_for(lambda: nstamps() >= n + POST_STEPS, "steps after commit", proc, 900)
        if args.stop:
            # A stop snapshot (SIGTERM: what a spot notice does) against the disk's own bandwidth,
            # measured in the same directory just before it.
            disk = disk_bandwidth(work, int(min(size_gb, 2.0) * GB))
            os.kill(sup["pid"], signal.SIGTERM)
            proc.wait(timeout=1800)
        else:
            open(stop_path, "w").close()
            proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    log = read_log(log_path)
    stamps = read_stamps(stamps_path)
    snaps = []
    for e in log:
        if e.get("event") == "committed":
            forked = next((f for f in log if f.get("event") == "forked" and f.get("id") == e["id"]), {})
            snaps.append({"id": e["id"], "commit_t": e["t"], "stall_s": forked.get("stall_s", e["stall_s"]),
                          "child_stall_s": e["stall_s"], "write_s": e["write_s"], "durable_s": e.get("durable_s"),
                          "drain_s": e.get("drain_s", 0.0), "drained_bytes": e.get("drained_bytes", 0),
                          "bytes_written": e["bytes_written"], "bytes_total": e["bytes_total"]})
    for s, t_req in zip(snaps, requests):
        s["request_t"] = t_req
    runs = sorted(os.listdir(os.path.join(rd, "packs"))) if os.path.isdir(os.path.join(rd, "packs")) else []
    du = sh(f"du -sb {rd} | cut -f1")
    shutil.rmtree(rd, ignore_errors=True)
    stop = None
    if args.stop:
        stop = snaps.pop() if snaps and len(snaps) > len(requests) else None
        if stop is not None:
            stop["disk"] = disk
    return {"stamps": stamps, "snaps": snaps, "rc": proc.returncode, "disk_bytes": int(du or 0), "packs": len(runs),
            "stop": stop}


def analyse(g: dict) -> dict:
    t = g["stamps"]
    steps = [(t[i], t[i + 1]) for i in range(len(t) - 1)]
    busy = set()  # indices of steps that overlap a write or its tail
    windows = []
    for s in g["snaps"]:
        idx = [i for i, (a, b) in enumerate(steps) if b > s["request_t"] and a < s["commit_t"]]
        last = idx[-1] if idx else 0
        tail = list(range(last + 1, min(len(steps), last + 1 + TAIL_STEPS)))
        windows.append((idx, tail))
        busy.update(idx + tail)
    quiet = [b - a for i, (a, b) in enumerate(steps) if i >= WARMUP_STEPS and i not in busy]
    base = statistics.median(quiet)
    sd = statistics.stdev(quiet) if len(quiet) > 1 else 0.0
    for s, (idx, tail) in zip(g["snaps"], windows):
        # error of a sum of n step deviations from a baseline whose steps scatter by sd
        s["noise_s"] = sd * (len(idx) + len(tail)) ** 0.5
        s["steps_in_write"] = len(idx)
        s["extra_write_s"] = sum(steps[i][1] - steps[i][0] - base for i in idx)
        s["extra_tail_s"] = sum(steps[i][1] - steps[i][0] - base for i in tail)
        s["extra_s"] = s["extra_write_s"] + s["extra_tail_s"]
    return {"base_s": base, "quiet_n": len(quiet), "quiet_spread": (min(quiet), max(quiet)), "quiet_sd": sd}


def fmt_b(n) -> str:
    return f"{n / GB:.3f} GB" if n else "-"


def report(size_gb: float, a: dict, g: dict, st: dict, say) -> dict:
    med = statistics.median
    ts = med(a["torch_save_s"])
    snaps = g["snaps"]
    say()
    say(f"== state {size_gb:g} GB: {a['depth']} x Linear({a['width']},{a['width']}) fp32 + Adam; "
        f"params+exp_avg+exp_avg_sq = {a['state_bytes'] / GB:.3f} GB ==")
    say(f"baseline step under gpusnap {st['base_s']:.3f} s (median of {st['quiet_n']} quiet steps, "
        f"range {st['quiet_spread'][0]:.3f}-{st['quiet_spread'][1]:.3f}); plain python {a['step_s']:.3f} s")
    say(f"{'':34}{'time s':>9}{'runs':>6}  {'bytes':>10}  {'/ torch.save':>12}")

    def row(name, vals, nbytes, ratio=True):
        v = med(vals) if isinstance(vals, list) else vals
        n = len(vals) if isinstance(vals, list) else 1
        r = f"{v / ts:11.1%}" if ratio else ""
        say(f"{name:34}{v:9.3f}{n:6}  {fmt_b(nbytes):>10}  {r:>12}")

    row("torch.save + fsync", a["torch_save_s"], a["torch_save_bytes"])
    row("dcp.save", a["dcp_save_s"], a["dcp_save_bytes"])
    row("dcp.async_save blocking", a["dcp_async_block_s"], a["dcp_async_bytes"])
    row("dcp.async_save until done", a["dcp_async_total_s"], None)
    for i, s in enumerate(snaps):
        kind = "full" if i == 0 else "incr"
        row(f"gpusnap #{i + 1} ({kind}) stall", s["stall_s"], None)
        row(f"gpusnap #{i + 1} ({kind}) drain (in writer)", s["drain_s"], s["drained_bytes"])
        row(f"gpusnap #{i + 1} ({kind}) writer", s["write_s"], s["bytes_written"])
        row(f"gpusnap #{i + 1} ({kind}) extra wall", s["extra_s"], None)
    later = snaps[1:] or snaps
    row("gpusnap later snaps stall (med)", [s["stall_s"] for s in later], None)
    stall_max = max(s["stall_s"] for s in snaps)
    row("gpusnap largest stall (all snaps)", stall_max, None)
    row("gpusnap later snaps extra (med)", [s["extra_s"] for s in later], None)
    say(f"gpusnap extra wall split (write window | {TAIL_STEPS} steps after commit): "
        + "; ".join(f"#{i + 1} {s['extra_write_s']:.2f} | {s['extra_tail_s']:.2f} over {s['steps_in_write']} steps"
                    f" (+-{s['noise_s']:.2f} step noise)" for i, s in enumerate(snaps)))
    say(f"gpusnap bytes: total per snapshot {fmt_b(snaps[0]['bytes_total'])}, written "
        + ", ".join(fmt_b(s["bytes_written"]) for s in snaps)
        + f"; run dir at end {fmt_b(g['disk_bytes'])}")
    cow = a["cow"]
    say(f"copy-on-write alone (plain python, idle forked child): fork {a['fork_s'] * 1e3:.1f} ms; step "
        f"{med(cow['before']):.3f} s before, {' '.join(f'{x:.3f}' for x in cow['during_fork'])} while child lives, "
        f"{' '.join(f'{x:.3f}' for x in cow['after_child_exit'])} after it exits")
    s = a.get("store")
    if s:
        say(f"gpusnap store alone on this state (plain python, no fork, no training): {s['wall_s']:.2f} s = "
            f"hash {s['hash_s']:.2f} + compress {s['compress_s']:.2f} + pack write/fsync {s['io_s']:.2f} "
            f"(+ rest); {fmt_b(s['bytes_total'])} -> {fmt_b(s['bytes_written'])}")
    if s:
        say("gpusnap time to durable (safe point to commit) / store alone: "
            + "; ".join(f"#{i + 1} {x['durable_s']:.2f} s = {x['durable_s'] / s['wall_s']:.2f}x" for i, x in enumerate(snaps)
                        if x.get("durable_s")))
    stop = g.get("stop")
    if stop:
        d = stop["disk"]
        floor = stop["bytes_written"] / d["bps"]
        say(f"stop snapshot (SIGTERM): fork to commit {stop['write_s']:.2f} s for {fmt_b(stop['bytes_written'])} written; "
            f"disk {d['bps'] / GB:.2f} GB/s ({', '.join(f'{k} {v / GB:.2f}' for k, v in d.items() if k != 'bps')}) -> "
            f"{floor:.2f} s at the disk's speed; {stop['write_s'] / floor:.2f}x -> "
            f"{'MET' if stop['write_s'] <= 1.25 * floor else 'NOT MET'} (goal <= 1.25x); durable {stop['durable_s']:.2f} s")
    stall1, stall_l = snaps[0]["stall_s"], med([s["stall_s"] for s in later])
    extra1, extra_l = snaps[0]["extra_s"], med([s["extra_s"] for s in later])
    ab = med(a["dcp_async_block_s"])
    ok = lambda c: "MET" if c else "NOT MET"  # noqa: E731
    say(f"target stall <= 5% of torch.save: #1 {stall1 / ts:.2%}, later {stall_l / ts:.2%}, largest "
        f"{stall_max / ts:.2%} -> {ok(stall_max <= 0.05 * ts)}")
    noise = max(s["noise_s"] for s in snaps)
    verdict = ok(max(extra1, extra_l) <= 0.5 * ts)
    if any(abs(s["extra_s"] - 0.5 * ts) < 2 * s["noise_s"] for s in snaps):
        verdict = f"INCONCLUSIVE (step noise up to +-{noise:.2f} s over the write window; quieter machine needed)"
    say(f"target extra wall <= 50% of torch.save: #1 {extra1 / ts:.1%}, later {extra_l / ts:.1%} -> {verdict}")
    say(f"dcp.async_save blocking / gpusnap stall: {ab / stall1:.1f}x (#1), {ab / stall_l:.1f}x (later)")
    return {"size": size_gb, "ts": ts, "stall": stall_max, "stall1": stall1, "stall_later": stall_l,
            "extra": max(extra1, extra_l)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.5,1.5,4", help="GB of model + Adam state, comma-separated")
    parser.add_argument("--quick", action="store_true", help="0.1 GB only, 2 snapshots, 2 anchor runs")
    parser.add_argument("--snapshots", type=int, default=3, help="gpusnap snapshots per size (first is full)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each anchor (median)")
    parser.add_argument("--dir", default="/work/bench-tmp", help="scratch directory (deleted at the end)")
    parser.add_argument("--out", default=None, help="raw output (default tools/results/bench_snapshot-cpu-DATE-TIME-threads-T.txt)")
    parser.add_argument("--keep", action="store_true", help="keep the run's scratch folder under --dir")
    parser.add_argument("--stop", action="store_true",
                        help="end each run with SIGTERM (a stop snapshot), timed against the disk's bandwidth")
    parser.add_argument("--settings", choices=("tuned", "default"), default="tuned",
                        help="tuned: --trainee-threads spare --malloc fixed; default: all, glibc (what an untuned program gets)")
    parser.add_argument("--trainee-threads", default=None,
                        help="torch threads of the training program: spare (cores - 1), all, or a number")
    parser.add_argument("--malloc", choices=("fixed", "glibc"), default=None,
                        help="fixed: pin glibc's mmap and trim thresholds (stable steps); glibc: its dynamic ones")
    args = parser.parse_args()
    tuned = args.settings == "tuned"
    # This checkout's gpusnap, in the runs and in the anchors' store-alone measure, whatever an
    # editable install points at.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    args.trainee_threads = args.trainee_threads or ("spare" if tuned else "all")
    args.malloc = args.malloc or ("fixed" if tuned else "glibc")
    if args.malloc == "fixed":
        os.environ.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(4 << 30))
    cores = os.cpu_count() or 1
    threads = {"spare": max(1, cores - 1), "all": cores}.get(args.trainee_threads) or int(args.trainee_threads)
    os.environ["BENCH_TRAINEE_THREADS"] = str(threads)
    if args.quick:
        args.sizes, args.snapshots, args.repeats = "0.1", 2, 2
    sizes = [float(s) for s in args.sizes.split(",")]
    here = os.path.dirname(os.path.abspath(__file__))
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")  # never overwrite an earlier run
    out = args.out or os.path.join(
        here, "results", f"bench_snapshot-cpu-{stamp}-{args.settings}-threads-{args.trainee_threads}-malloc-{args.malloc}{'-quick' if args.quick else ''}.txt")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    say = Tee(out)
    os.makedirs(args.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="bench_snapshot-", dir=args.dir)  # all this run writes; removed after
    environment(args, say)
    prog = os.path.join(scratch, "train_bench.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    summary = []
    started = time.time()
    try:
        for size in sizes:
            work = os.path.join(scratch, f"s{size:g}")
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            t0 = time.time()
            a = run_anchors(prog, size, work, args)
            t1 = time.time()
            g = run_gpusnap(prog, size, work, args, say)
            st = analyse(g)
            summary.append(report(size, a, g, st, say))
            say(f"(anchors {t1 - t0:.0f} s, gpusnap run {time.time() - t1:.0f} s, rc {g['rc']})")
            with open(os.path.join(scratch, f"raw-{size:g}.json"), "w") as f:
                json.dump({"anchors": a, "gpusnap": g, "stats": st}, f)
            say("# raw " + json.dumps({"anchors": a, "snaps": g["snaps"], "stop": g["stop"], "base_s": st["base_s"]}))
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    say()
    say("== summary ==")
    say(f"{'size GB':>8}{'torch.save s':>14}{'stall s':>10}{'#1 s':>8}{'later s':>9}{'stall %':>9}"
        f"{'extra s':>10}{'extra %':>9}")
    for s in summary:
        say(f"{s['size']:8g}{s['ts']:14.3f}{s['stall']:10.3f}{s['stall1']:8.3f}{s['stall_later']:9.3f}"
            f"{s['stall'] / s['ts']:9.1%}{s['extra']:10.3f}{s['extra'] / s['ts']:9.1%}")
    say(f"(stall: the largest of the run, the first snapshot included; #1: the first; later: median of "
        f"the others; extra: worst of first and later; settings {args.settings}; total "
        f"{time.time() - started:.0f} s; raw output {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
