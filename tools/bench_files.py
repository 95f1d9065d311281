"""What keeping the program's files costs (gpusnap/files).

    python tools/bench_files.py [--files 0,10,100,1000] [--repeats 50] [--snapshots 12]

1. The stall: ``files.record.stage``, which a snapshot runs before its fork, timed in this
   process for N files the program wrote: all unchanged since the last snapshot (an lstat each:
   their lengths recorded, their chunks reused), every one appended to since (a log: read by
   the writer from its last whole chunk, not in the stall), every one rewritten (small: read in
   the stall).
2. The audit hook: what one audit event costs the program once the watch is installed (every
   ``id()`` and ``open()`` raises one), against the same calls before.
3. A run: tests/programs/notorch/metrics_file.py appends a line to a log at every step and
   rewrites a 1 MB metrics file every 10 steps (an epoch), under ``gpusnap run``, with a snapshot
   asked for every 5 steps; then the same with ``--files-exclude /`` (no file kept). Per
   snapshot: the stall and the bytes written, those after a rewrite and those without one.
4. The writer: the hook is inherited by the forked writer, whose walks of the program's objects
   raise an audit event per ``id()``. A program holding 200,000 small dicts (about a million
   objects), three snapshots with the watch and three without: the writer's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import wait_for  # noqa: E402

PROGRAM = REPO / "tests" / "programs" / "notorch" / "metrics_file.py"


def bench_stall(counts: list[int], repeats: int) -> list[str]:
    from gpusnap import knobs
    from gpusnap.files import record, watch
    from gpusnap.files.paths import Excludes

    lines = ["1. stall of files.record.stage (ms, median of %d)" % repeats,
             f"   {'files':>6} {'unchanged':>10} {'appended':>10} {'rewritten':>10}  (rewritten: 4 KiB each, read in the stall)"]
    top = pathlib.Path(tempfile.mkdtemp(prefix="bench_files-"))
    run_dir = top / "run"
    (run_dir / "snapshots").mkdir(parents=True)
    watch.install(str(run_dir / watch.JOURNAL), Excludes((), str(top), always=[str(run_dir)]))
    record.install(knobs.FILES_MAX_BYTES)
    serial = [0]

    def stage_ms() -> float:
        serial[0] += 1
        snap_id = f"{serial[0]:06d}"
        started = time.perf_counter()
        job = record.stage(snap_id, str(run_dir))
        spent = time.perf_counter() - started
        record.forked(job)
        (run_dir / "snapshots" / f"{snap_id}.json").write_text("{}")  # committed: the next stage reuses its chunks
        return spent * 1000

    for n in counts:
        folder = top / f"n{n}"
        folder.mkdir()
        paths = [folder / f"log{i}.txt" for i in range(n)]
        for p in paths:
            with open(p, "a") as f:
                f.write("x" * 4096)
        stage_ms()
        unchanged = statistics.median(stage_ms() for _ in range(repeats))
        appended = []
        for _ in range(repeats):
            for p in paths:
                with open(p, "a") as f:
                    f.write("step\n")
            appended.append(stage_ms())
        rewritten = []
        for _ in range(repeats):
            for p in paths:
                with open(p, "w") as f:
                    f.write("y" * 4096)
            rewritten.append(stage_ms())
        lines.append(f"   {n:>6} {unchanged:>10.3f} {statistics.median(appended):>10.3f} {statistics.median(rewritten):>10.3f}")
        for p in paths:
            watch.notes.pop(str(p), None)
    for nbytes in (1 << 20, 64 << 20):
        big = top / f"big{nbytes}.csv"
        times = []
        for k in range(min(repeats, 10)):
            with open(big, "wb") as f:  # rewritten in place, as a metrics file at every epoch's end
                f.write(bytes([k]) * nbytes)
            times.append(stage_ms())
        where = "read in the stall" if nbytes <= knobs.FILES_STALL_READ_BYTES else "read by the writer: the stall opens it"
        lines.append(f"   one {nbytes >> 20} MiB file rewritten: {statistics.median(times):.3f} ms ({where})")
        watch.notes.pop(str(big), None)
    return lines


def bench_hook() -> list[str]:
    def per_call(fn, n=200_000) -> float:
        started = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - started) / n * 1e9

    obj = object()
    target = os.path.join(tempfile.mkdtemp(prefix="bench_files-"), "r.txt")
    open(target, "w").close()

    def read_open():
        open(target).close()

    before = (per_call(lambda: id(obj)), per_call(read_open, 20_000))
    from gpusnap.files import watch

    if not watch.active():
        from gpusnap.files.paths import Excludes

        watch.install(target + ".journal", Excludes((), "/"))
    after = (per_call(lambda: id(obj)), per_call(read_open, 20_000))
    return ["2. audit hook: ns per call, before and after the watch is installed",
            f"   id(x)            {before[0]:8.0f} -> {after[0]:8.0f}  (+{after[0] - before[0]:.0f} ns per audit event)",
            f"   open(f).close()  {before[1]:8.0f} -> {after[1]:8.0f}  (a read: passed over)"]


def bench_run(snapshots: int, keep_files: bool) -> dict:
    top = pathlib.Path(tempfile.mkdtemp(prefix="bench_files-run-"))
    out, run_dir = top / "out", top / "run"
    out.mkdir()
    cmd = [sys.executable, "-m", "gpusnap", "run", "--dir", str(run_dir), *([] if keep_files else ["--files-exclude", "/"]),
           str(PROGRAM), str(out), "100000", "10", str(1 << 20)]
    env = {**os.environ, "TEST_STEP_SLEEP_S": "0.05", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=top, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    progress = lambda: int((out / "progress").read_text() or 0) if (out / "progress").exists() else 0  # noqa: E731
    done = []
    try:
        for k in range(snapshots):
            wait_for(lambda: progress() >= 12 + 5 * k, f"step {12 + 5 * k}", proc)
            before = _committed(run_dir)
            os.kill(proc.pid, signal.SIGUSR1)
            done.extend(wait_for(lambda: _committed(run_dir) - before, "a committed snapshot", proc))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rows, last = [], None
    for name in sorted(done):
        m = json.loads((run_dir / "snapshots" / name).read_text())
        files = m.get("files") or {}
        # Rewritten since the last snapshot: its time in the table differs; without a table, by the
        # steps (the program rewrites it in steps 0, 10, 20..., iteration i is the boundary after
        # step i - 1).
        stamp = next((e["mtime_ns"] for e in files.get("entries", ()) if e["path"].endswith("metrics.csv")), None)
        if last is not None:  # the first snapshot stores everything: not a steady state
            if files:
                rewritten = stamp != last[1]
            else:
                rewritten = any(step % 10 == 0 for step in range(last[0], m["iteration"]))
            rows.append({"stall_s": m["stall_s"], "bytes_written": m["stats"]["bytes_written"],
                         "bytes_new": m["stats"]["bytes_new"], "stall_read": files.get("stall_read_bytes", 0),
                         "rewritten": rewritten})
        last = (m["iteration"], stamp)
    return {"rows": rows}


GRAPH_PROGRAM = """
import sys
sys.path.insert(0, {pace!r})
from pace import progress
state = [{{"i": i, "name": f"n{{i}}", "vals": [i, i + 1.5, (i, str(i))]}} for i in range(200_000)]
for step in range(1_000_000):
    state[step % len(state)]["i"] += 1
    progress(step + 1)
"""


def bench_writer_cpu(snapshots: int = 3) -> list[str]:
    top = pathlib.Path(tempfile.mkdtemp(prefix="bench_files-graph-"))
    program = top / "graph.py"
    program.write_text(GRAPH_PROGRAM.format(pace=str(PROGRAM.parent)))
    out = ["4. writer CPU seconds per snapshot of a program holding 200,000 dicts (about 1M objects)"]
    for label, extra in (("watched", []), ("--files-exclude /", ["--files-exclude", "/"])):
        run_dir, work = top / f"run-{len(extra)}", top / f"out-{len(extra)}"
        work.mkdir()
        cmd = [sys.executable, "-m", "gpusnap", "run", "--dir", str(run_dir), *extra, str(program), str(work)]
        env = {**os.environ, "TEST_STEP_SLEEP_S": "0.05", "PYTHONPATH": str(REPO), "GPUSNAP_WRITER_PRIORITY": "0"}
        proc = subprocess.Popen(cmd, cwd=top, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            wait_for(lambda: (work / "progress").exists(), "the first step", proc)
            for k in range(snapshots):
                os.kill(proc.pid, signal.SIGUSR1)
                wait_for(lambda: len(_committed(run_dir)) > k, "a commit", proc)
            time.sleep(1)  # the last committed event reaches the log
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        cpu = [json.loads(line)["writer_cpu_s"] for line in open(run_dir / "log.jsonl") if '"event":"committed"' in line]
        out.append(f"   {label:<20} {', '.join(f'{c:.2f}' for c in cpu)} s (median {statistics.median(cpu):.2f})")
    return out


def _committed(run_dir: pathlib.Path) -> set[str]:
    """The committed manifests' names (a snapshot exists once its manifest has its name)."""
    return {n for n in os.listdir(run_dir / "snapshots") if n.endswith(".json")}


def summarize(label: str, result: dict) -> list[str]:
    rows = result["rows"]
    out = [f"   {label}: {len(rows)} snapshots after the first"]
    for what, pick in (("after a rewrite of the metrics file", True), ("with no rewrite since the last snapshot", False)):
        chosen = [r for r in rows if r["rewritten"] == pick]
        if chosen:
            out.append(f"     {what}: {len(chosen)}, stall {statistics.median(r['stall_s'] for r in chosen) * 1000:.1f} ms (median), "
                       f"bytes written {statistics.mean(r['bytes_written'] for r in chosen) / 1e3:.1f} kB (mean; new raw "
                       f"{statistics.mean(r['bytes_new'] for r in chosen) / 1e3:.1f} kB, read in the stall "
                       f"{statistics.mean(r['stall_read'] for r in chosen) / 1e3:.1f} kB)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="0,10,100,1000")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--snapshots", type=int, default=12)
    args = parser.parse_args()
    print(f"bench_files on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}, python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.1f} (other programs share the cores: times scatter with it)")
    print(f"command: python tools/bench_files.py --files {args.files} --repeats {args.repeats} --snapshots {args.snapshots}")
    for line in bench_stall([int(n) for n in args.files.split(",")], args.repeats):
        print(line, flush=True)
    for line in bench_hook():
        print(line, flush=True)
    print("3. metrics_file.py: a line a step to a log, a 1 MB metrics file rewritten every 10 steps, a snapshot every 5 steps")
    for label, keep in (("files kept", True), ("--files-exclude / (no file kept)", False)):
        for line in summarize(label, bench_run(args.snapshots, keep)):
            print(line, flush=True)
    for line in bench_writer_cpu():
        print(line, flush=True)


if __name__ == "__main__":
    main()
