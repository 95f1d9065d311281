"""How long a restart takes, part by part, against torch.load of the same state from the same disk,
in one run.

    python tools/bench_restart.py [--sizes 1] [--dir /work/bench-tmp] [--out FILE]

For each size S (GB of model + Adam state: bench_snapshot's MLP of square fp32 Linear layers):

1. torch: a plain process builds the state, trains two steps, ``torch.save``s model and optimizer
   state dicts (fsync), drops the file from the page cache (posix_fadvise DONTNEED: a restart on
   a fresh node reads from the disk), then times ``torch.load`` and the copy into a freshly
   built model and optimizer (``load_state_dict``).
2. gpusnap: the same program under ``gpusnap run``, stopped by SIGTERM after its second step (a
   stop snapshot, exit 75); the packs are dropped from the page cache; ``gpusnap restart`` runs
   the program again to that point and restores it. Its ``restored`` event in log.jsonl gives
   the split: replay (the program's own start up to the resume point: imports, building the
   model), read + decompress (the wall time of the threads that read, check and decode every
   chunk), unpickle (the rest of the load), and copy into place (the merge).

Goal (issue 26): read + decompress at most 1.3x torch.load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from common import MLP, Tee, git_commit, wait_for

GB = 1e9
REPO = pathlib.Path(__file__).resolve().parents[1]
PROGRAM = textwrap.dedent(
    '''
    import json, os, sys, time
    import torch

    {MLP}
    def evict(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    mode, state_bytes = sys.argv[1], float(sys.argv[2])
    model, opt, x, _, _ = build(state_bytes)
    if mode == "train":
        out, steps = sys.argv[3], int(sys.argv[4])
        for i in range(steps):
            step(model, opt, x)
            with open(os.path.join(out, "progress"), "w") as f:
                f.write(str(i + 1))
            time.sleep(0.2)
        sys.exit(0)
    # mode == "torch": the anchor
    path = sys.argv[3]
    for _ in range(2):
        step(model, opt, x)
    with open(path, "wb") as f:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    nbytes = os.path.getsize(path)
    fresh, fresh_opt, *_ = build(state_bytes)
    step(fresh, fresh_opt, x)  # the optimizer has its state tensors, as a replayed one would
    evict(path)
    t0 = time.perf_counter()
    state = torch.load(path)
    t1 = time.perf_counter()
    fresh.load_state_dict(state["model"])
    fresh_opt.load_state_dict(state["optim"])
    t2 = time.perf_counter()
    print("TORCH " + json.dumps({"load_s": t1 - t0, "copy_s": t2 - t1, "nbytes": nbytes}), flush=True)
    '''
).replace("{MLP}\n", MLP + "\n")


def evict_tree(root: pathlib.Path) -> None:
    for path in root.rglob("*.pack"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def events(run_dir: pathlib.Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if e.get("event") == kind]


def one_size(size_gb: float, work: pathlib.Path, say) -> dict:
    prog = work / "train.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, str(prog), "torch", str(size_gb * GB), str(work / "state.pt")],
                       capture_output=True, text=True, env=env, timeout=3600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("TORCH ")), None)
    if line is None:
        raise RuntimeError(f"the torch anchor failed:\n{p.stderr[-3000:]}")
    anchor = json.loads(line[6:])
    (work / "state.pt").unlink()

    out = work / "out"
    out.mkdir()
    run_dir = work / "run"
    args = ["--dir", str(run_dir), str(prog), "train", str(size_gb * GB), str(out), "4"]
    proc = subprocess.Popen([sys.executable, "-m", "gpusnap", "run", *args], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (out / "progress").exists() and (out / "progress").read_text() == "2", "step 2", proc, 3600)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=3600)
    if proc.returncode != 75:
        raise RuntimeError(f"the stop snapshot failed ({proc.returncode}): {proc.stderr.read()[-3000:]}")
    committed = events(run_dir, "committed")[-1]
    evict_tree(run_dir)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gpusnap", "restart", str(run_dir)], cwd=work, env=env,
                       capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"the restart failed ({r.returncode}): {r.stderr[-3000:]}")
    restored = events(run_dir, "restored")[-1]
    fetch = restored["fetch_s"]
    result = {"size": size_gb, "torch_load_s": anchor["load_s"], "torch_copy_s": anchor["copy_s"], "torch_bytes": anchor["nbytes"],
              "bytes_written": committed["bytes_written"], "bytes_total": committed["bytes_total"], "restart_wall_s": wall,
              **{k: restored.get(k) for k in ("replay_s", "fastforward_s", "merge_s", "load_s", "read_s", "decode_s",
                                               "check_s", "fetch_s", "nbytes")}}
    say()
    say(f"== state {size_gb:g} GB: torch.save file {anchor['nbytes'] / GB:.3f} GB; snapshot {committed['bytes_total'] / GB:.3f} GB, "
        f"{committed['bytes_written'] / GB:.3f} GB in packs ==")
    say(f"torch.load (cold)                    {anchor['load_s']:8.3f} s")
    say(f"torch load_state_dict (copy)         {anchor['copy_s']:8.3f} s")
    say(f"gpusnap restart, wall                {wall:8.3f} s")
    say(f"  replay (program up to the resume)  {restored['replay_s']:8.3f} s")
    say(f"  fast-forward                       {restored['fastforward_s']:8.3f} s")
    say(f"  read + decompress (wall, threads)  {fetch:8.3f} s   (summed over threads: read {restored['read_s']:.3f}, "
        f"decode {restored['decode_s']:.3f}, check {restored['check_s']:.3f})")
    say(f"  unpickle (rest of the load)        {max(restored['load_s'] - fetch, 0.0):8.3f} s")
    say(f"  copy into place (rest of merge)    {restored['merge_s'] - restored['load_s']:8.3f} s")
    ratio = fetch / anchor["load_s"]
    say(f"read + decompress / torch.load: {ratio:.2f}x -> {'MET' if ratio <= 1.3 else 'NOT MET'} (goal <= 1.3x)")
    say("# raw " + json.dumps(result))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1", help="GB of model + Adam state, comma-separated")
    parser.add_argument("--dir", default="/work/bench-tmp", help="scratch directory (removed at the end)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or str(REPO / "tools" / "results" / f"bench_restart-cpu-{stamp}.txt")
    os.makedirs(args.dir, exist_ok=True)
    say = Tee(out)
    commit = git_commit(REPO)
    df = subprocess.run(["df", "-h", "--output=source,fstype", args.dir], capture_output=True, text=True).stdout.split()[-2:]
    say(f"# bench_restart {datetime.datetime.now().isoformat(timespec='seconds')}; gpusnap {commit}; {os.cpu_count()} cores; "
        f"load avg {os.getloadavg()[0]:.2f}; disk {args.dir} ({' '.join(df)})")
    say(f"# command: python tools/bench_restart.py --sizes {args.sizes} --dir {args.dir}")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="bench_restart-", dir=args.dir))
    try:
        for size in (float(s) for s in args.sizes.split(",")):
            work = scratch / f"s{size:g}"
            work.mkdir()
            one_size(size, work, say)
            say(f"# load avg {os.getloadavg()[0]:.2f}")
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"raw output: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
