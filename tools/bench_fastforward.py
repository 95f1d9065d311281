"""What a restart at batch 100,000 of a DataLoader loop costs, and what it loads.

    python tools/bench_fastforward.py [--items 3500000] [--at 100000] [--fetch 10] [--naive 2000]
                                      [--e2e-items 3500000] [--no-e2e] [--save]

1. In process: a shuffled DataLoader (batch 32) over --items tiny items whose __getitem__ is
   counted (a multiprocessing.Value, so loads in workers count too), workers 0 and 2. The note is
   taken as the capture side takes it (``describe`` before ``iter``), then ``iterator_at`` goes
   to batch --at and --fetch batches are fetched: time to position, time per fetched batch,
   __getitem__ calls. The batch reached is checked against the sampler's own batch --at.
   Versus the naive way (``iter`` and consume --at batches): timed on --naive consumed batches
   and extrapolated linearly to --at (said so in the output).
2. End to end: a script (``for epoch in range(2): for x in loader:``, --e2e-items items returning
   their index, batch 32, a checksum as the only work) runs under ``gpusnap run``; at batch --at
   of epoch 0 SIGUSR1 goes to the supervisor, and once the snapshot is committed the process
   group is killed with SIGKILL. ``gpusnap restart`` then continues it; its replay / fast-forward
   / merge times come from its stderr and log.jsonl, and the script reports how many items this
   process loaded in the resumed epoch (a counter the restore cannot overwrite) and the final
   checksum, compared with an uninterrupted plain run.

--save writes the printed output and machine facts to tools/results/bench_fastforward-cpu-DATE.txt.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
from common import read_json, wait_for
from torch.utils.data import DataLoader, Dataset

from gpusnap.capture.trainee import loopnotes
from gpusnap.graph import rng
from gpusnap.restore import fastforward

BATCH = 32
PREFETCH_FACTOR = 2  # torch's default, named here because the worker count below depends on it


class CountedItems(Dataset):
    """Item i is i; every __getitem__ bumps a shared counter and logs the first ``log_cap``
    indices loaded (shared memory, so forked workers' loads count too)."""

    def __init__(self, n: int, log_cap: int = 4096):
        self.n = n
        self.calls = multiprocessing.Value("q", 0, lock=True)
        self.log = multiprocessing.Array("q", log_cap, lock=False)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.calls.get_lock():
            slot = self.calls.value
            self.calls.value += 1
        if slot < len(self.log):
            self.log[slot] = i
        return i

    def loaded(self) -> set[int]:
        return set(self.log[: min(self.calls.value, len(self.log))])


def _print(out: io.StringIO, text: str = "") -> None:
    print(text, flush=True)
    out.write(text + "\n")


def bench_in_process(out, items: int, at: int, fetch: int, naive: int) -> list[dict]:
    rows = []
    for workers in (0, 2):
        dataset = CountedItems(items)
        kwargs = {"prefetch_factor": PREFETCH_FACTOR} if workers else {}
        loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, **kwargs)
        torch.manual_seed(0)
        note = json.loads(json.dumps(loopnotes.note_json(fastforward.describe(loader))))

        # What batch `at` must be: the sampler's own sequence from the same RNG state
        # (iter() draws the workers' base seed first, then RandomSampler its seed).
        rng.restore_json(note["rng"])
        torch.empty((), dtype=torch.int64).random_()
        in_flight = 2 * PREFETCH_FACTOR if workers else 0
        expected = []
        for b, indices in enumerate(loader.batch_sampler):
            if b >= at:
                expected.append(indices)
            if b == at + fetch + in_flight - 1:
                break

        torch.rand(7)
        dataset.calls.value = 0
        started = time.perf_counter()
        it, how = fastforward.iterator_at(loader, at, note)
        position_s = time.perf_counter() - started
        calls_positioned = dataset.calls.value
        started = time.perf_counter()
        got = [next(it) for _ in range(fetch)]
        fetch_s = time.perf_counter() - started
        time.sleep(0.5 if workers else 0)  # let the workers finish what they prefetched
        calls = dataset.calls.value
        correct = all(torch.equal(g, torch.tensor(e)) for g, e in zip(got, expected))
        allowed = {i for e in expected for i in e}
        only_wanted = calls <= len(dataset.log) and dataset.loaded() <= allowed
        del it

        dataset.calls.value = 0
        it = iter(loader)
        started = time.perf_counter()
        for _ in range(naive):
            next(it)
        naive_s = time.perf_counter() - started
        del it
        rows.append(
            {
                "workers": workers,
                "how": how,
                "position_s": position_s,
                "per_batch_ms": fetch_s / fetch * 1e3,
                "calls_positioned": calls_positioned,
                "calls": calls,
                "batch_correct": correct,
                "only_wanted": only_wanted,
                "naive_per_batch_ms": naive_s / naive * 1e3,
                "naive_est_s": naive_s / naive * at,
            }
        )
    _print(out, f"## in process: {items:,} items, batch {BATCH}, shuffle=True, to batch {at:,}, then {fetch} batches")
    _print(out, f"{'workers':>7}  {'position':>9}  {'per batch':>9}  {'calls at position':>17}  {'calls after fetch':>17}  "
                f"{'batches ok':>10}  {'loads only ' + format(at, ',') + '..':>20}  {'naive per batch':>15}  {'naive to batch ' + format(at, ','):>22}")
    for r in rows:
        _print(out, f"{r['workers']:>7}  {r['position_s']:>7.2f} s  {r['per_batch_ms']:>6.2f} ms  {r['calls_positioned']:>17,}  "
                    f"{r['calls']:>17,}  {str(r['batch_correct']):>10}  {str(r['only_wanted']):>20}  {r['naive_per_batch_ms']:>12.3f} ms  "
                    f"{r['naive_est_s']:>18.1f} s est")
    _print(out, f"(how: {rows[0]['how']!r}. naive = iter() and consume {naive:,} batches, timed and extrapolated "
                f"linearly to {at:,}; it also loads {at * BATCH:,} samples. Workers 0: calls must be exactly "
                f"{fetch} x {BATCH} = {fetch * BATCH}. Workers 2: iter() already sends {2 * PREFETCH_FACTOR} batches "
                f"(2 workers x prefetch_factor {PREFETCH_FACTOR}) and each fetch sends one more, so "
                f"{fetch} fetched + {2 * PREFETCH_FACTOR} in flight = {(fetch + 2 * PREFETCH_FACTOR) * BATCH} loads, "
                f"all of batches {at:,}..{at + fetch + 2 * PREFETCH_FACTOR - 1:,}. 'batches ok': the {fetch} batches equal "
                f"the sampler's own batches {at:,}..; 'loads only': every index loaded belongs to those batches "
                f"(or the ones in flight), none to a skipped batch.)")
    return rows


SCRIPT = '''
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

OUT = sys.argv[1]
N = int(sys.argv[2])
# This process's own loads, kept on the sys module: the restore puts the program's objects and
# globals back to the snapshot, which would also put back a counter kept on them.
sys.bench_loads = [0]
sys.bench_epoch_loads = []


class Items(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        sys.bench_loads[0] += 1
        return i


def report(name, value):
    tmp = os.path.join(OUT, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, os.path.join(OUT, name))


torch.manual_seed(0)
loader = DataLoader(Items(), batch_size=32, shuffle=True)
checksum = 0
batches = 0
for epoch in range(2):
    done = 0
    for x in loader:
        checksum = (checksum * 1000003 + int(x[0]) * 7 + int(x[-1])) % 2305843009213693951
        batches += 1
        done += 1
        if done % 1000 == 0:
            report("progress", {"epoch": epoch, "batch": done})
    sys.bench_epoch_loads.append(sys.bench_loads[0] - sum(sys.bench_epoch_loads))
report("final.json", {"pid": os.getpid(), "checksum": checksum, "batches": batches,
                      "loads": sys.bench_loads[0], "epoch_loads": sys.bench_epoch_loads})
'''


def _gpusnap(*args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "gpusnap", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _snapshots(run_dir: Path, cwd: Path) -> list:
    result = _gpusnap("ls", run_dir, "--json", cwd=cwd)
    return json.loads(result.stdout) if result.returncode == 0 else []


def bench_end_to_end(out, items: int, at: int) -> dict:
    per_epoch = -(-items // BATCH)
    with tempfile.TemporaryDirectory(prefix="gpusnap-bench-ff-") as tmp:
        tmp = Path(tmp)
        (tmp / "train.py").write_text(textwrap.dedent(SCRIPT))
        ref, res, run_dir = tmp / "ref", tmp / "out", tmp / "snaps"
        ref.mkdir()
        res.mkdir()

        started = time.perf_counter()
        subprocess.run([sys.executable, "train.py", str(ref), str(items)], cwd=tmp, check=True, timeout=900)
        plain_s = time.perf_counter() - started
        reference = read_json(ref / "final.json")

        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "gpusnap", "run", "--dir", run_dir, "train.py", res, str(items)],
                                cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            reached = wait_for(lambda: (p := read_json(res / "progress")) and p["epoch"] == 0 and p["batch"] >= at and p,
                               f"batch {at}", proc=proc)
            reach_s = time.perf_counter() - started
            supervisor = read_json(run_dir / "supervisor.json")
            os.kill(supervisor["pid"], signal.SIGUSR1)
            snap = wait_for(lambda: _snapshots(run_dir, tmp), "a committed snapshot", proc=proc)[-1]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        assert not (res / "final.json").exists(), "the program finished before it was killed"

        started = time.perf_counter()
        restarted = _gpusnap("restart", run_dir, cwd=tmp, timeout=900)
        restart_s = time.perf_counter() - started
        if restarted.returncode != 0:
            raise RuntimeError(f"restart failed ({restarted.returncode}): {restarted.stderr}")
        final = read_json(res / "final.json")
        log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
        restored = [e for e in log if e.get("event") == "restored"]
        gpusnap_lines = [line for line in restarted.stderr.splitlines() if line.startswith("gpusnap:")]

    snap_batch = snap["iteration"]
    expected_loads = (per_epoch - snap_batch) * BATCH - (per_epoch * BATCH - items)
    row = {
        "plain_s": plain_s,
        "reach_s": reach_s,
        "reached": reached,
        "snap": snap,
        "restart_s": restart_s,
        "restored": restored[-1] if restored else None,
        "stderr": gpusnap_lines,
        "final": final,
        "reference": reference,
        "expected_epoch0_loads": expected_loads,
    }
    _print(out, f"## end to end: {items:,} items ({per_epoch:,} batches of {BATCH} an epoch), 2 epochs, "
                f"SIGUSR1 at batch {at:,} of epoch 0, kill -9, gpusnap restart")
    _print(out, f"uninterrupted plain run (2 epochs): {plain_s:.1f} s; under gpusnap run, batch {reached['batch']:,} "
                f"reached after {reach_s:.1f} s; snapshot {snap['id']} at iteration {snap_batch:,}")
    _print(out, "restart stderr (gpusnap lines):")
    for line in gpusnap_lines:
        _print(out, "    " + line)
    if row["restored"]:
        _print(out, "log.jsonl 'restored' event: " + json.dumps(row["restored"]))
    _print(out, f"restart wall time (whole restarted run, incl. the rest of epoch 0 and all of epoch 1): {restart_s:.1f} s")
    _print(out, f"loads in the restarted process, resumed epoch 0: {final['epoch_loads'][0]:,} "
                f"(expected ({per_epoch:,} - {snap_batch:,}) batches = {expected_loads:,}; "
                f"loading the skipped batches would add {snap_batch * BATCH:,}); epoch 1: {final['epoch_loads'][1]:,}")
    _print(out, f"final checksum equals the uninterrupted run's: {final['checksum'] == reference['checksum']} "
                f"(batches seen: restarted {final['batches']:,}, plain {reference['batches']:,})")
    return row


def machine_facts() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"date: {datetime.datetime.now().isoformat(timespec='seconds')}\ncpu: {cpu}\ncores: {os.cpu_count()}\n"
            f"python: {platform.python_version()}\ntorch: {torch.__version__}\nplatform: {platform.platform()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3_500_000)
    parser.add_argument("--at", type=int, default=100_000)
    parser.add_argument("--fetch", type=int, default=10)
    parser.add_argument("--naive", type=int, default=2_000)
    parser.add_argument("--e2e-items", type=int, default=3_500_000)
    parser.add_argument("--no-e2e", action="store_true")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    if args.at >= -(-args.items // BATCH) or args.at >= -(-args.e2e_items // BATCH):
        parser.error("--at must be a batch inside an epoch")

    out = io.StringIO()
    _print(out, machine_facts())
    _print(out)
    rows = bench_in_process(out, args.items, args.at, args.fetch, args.naive)
    e2e = None
    if not args.no_e2e:
        _print(out)
        e2e = bench_end_to_end(out, args.e2e_items, args.at)

    _print(out)
    _print(out, "## summary")
    for r in rows:
        _print(out, f"in process, workers {r['workers']}: position at batch {args.at:,} in {r['position_s']:.2f} s "
                    f"(naive ~{r['naive_est_s']:.0f} s est), {r['per_batch_ms']:.2f} ms per fetched batch, "
                    f"{r['calls']:,} __getitem__ calls for {args.fetch} batches")
    if e2e:
        restored = e2e["restored"] or {}
        timings = ", ".join(f"{k.removesuffix('_s')} {restored[k]:.2f} s" for k in ("replay_s", "fastforward_s", "merge_s") if k in restored)
        _print(out, f"end to end: reaching batch {args.at:,} took the program {e2e['reach_s']:.1f} s; restart {timings}; "
                    f"loads in the resumed epoch {e2e['final']['epoch_loads'][0]:,} (expected {e2e['expected_epoch0_loads']:,}); "
                    f"same checksum: {e2e['final']['checksum'] == e2e['reference']['checksum']}")

    if args.save:
        results = Path(__file__).parent / "results"
        results.mkdir(exist_ok=True)
        path = results / f"bench_fastforward-cpu-{datetime.date.today().isoformat()}.txt"
        command = "python tools/bench_fastforward.py " + " ".join(sys.argv[1:])
        path.write_text(f"$ {command}\n\n{out.getvalue()}")
        print(f"saved {path}")


if __name__ == "__main__":
    main()
