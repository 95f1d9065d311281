"""Bytes written per snapshot under each way of encoding a chunk, on real training states from the
test corpus, in one run: which compression, filter and delta pay for themselves.

    python tools/bench_codec.py [--between 20] [--dir /work/bench-tmp] [--out FILE]

For each program (tests/programs/corpus: char_rnn, a GRU language model with Adam; dcgan, two
conv nets with an Adam each; both sized up by their arguments), the program runs under
`gpusnap run` with GPUSNAP_CODEC=none (raw packs, read back cheaply), SIGUSR1 takes a snapshot
after warm-up and another --between steps later. Every float buffer of the second snapshot is
cut into the store's chunks and each chunk encoded every way, one thread, the second snapshot's
chunks only where the first did not hold them (what a writer would write):

    raw                          the chunk's bytes
    lz4+bitshuffle, lz4+shuffle  blosc2 LZ4 level 1
    zstd+shuffle, zstd+bitshuffle, zstd+shuffle+bytedelta   blosc2 ZSTD level 1
    xor ...                      the chunk XOR the same chunk of the same buffer in the first
                                 snapshot (a lossless delta), then each codec above
    auto @ D GB/s                what store/choose.py picks per chunk at a disk of D GB/s, with
                                 this machine's compression speeds (threads = cores)

Printed: bytes written and their ratio to raw, and each codec's speed (MB/s of raw bytes, one
thread). The load average goes in the header: speeds on a shared machine are only indicative.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import Tee, git_commit  # noqa: E402
from gpusnap.store import RunDir, codec  # noqa: E402
from gpusnap.store.choose import Chooser, _faster  # noqa: E402

PROGRAMS = {
    "char_rnn": ["corpus/char_rnn.py", "--hidden-size", "384", "--n-layers", "2", "--steps", "100000",
                 "--sample-every", "100000"],
    "dcgan": ["corpus/dcgan.py", "--ngf", "96", "--ndf", "96", "--niter", "100000"],
}
CODECS = {  # name: (blosc2 codec, filters)
    "lz4+bitshuffle": ("LZ4", ["BITSHUFFLE"]),
    "lz4+shuffle": ("LZ4", ["SHUFFLE"]),
    "zstd+shuffle": ("ZSTD", ["SHUFFLE"]),
    "zstd+bitshuffle": ("ZSTD", ["BITSHUFFLE"]),
    "zstd+shuffle+bytedelta": ("ZSTD", ["SHUFFLE", "BYTEDELTA"]),
}
DISKS_GBPS = (0.1, 0.5, 1.0, 2.0)


def progress(out: pathlib.Path) -> int:
    try:
        return int((out / "progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


def wait(predicate, what: str, proc, timeout: float = 1800):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the program exited while waiting for {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def two_snapshots(name: str, args: list[str], work: pathlib.Path, warmup: int, between: int) -> RunDir:
    """Run the program; snapshot at step ``warmup`` and ``between`` steps later."""
    programs = work / "programs"
    shutil.copytree(REPO / "tests" / "programs", programs, ignore=shutil.ignore_patterns("__pycache__"))
    out = work / "out"
    out.mkdir()
    env = dict(os.environ, GPUSNAP_CODEC="none", TEST_STEP_SLEEP_S="0", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "gpusnap", "run", "--dir", str(work / "run"), str(programs / args[0]),
                             str(out), *args[1:]], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        snaps = work / "run" / "snapshots"
        for k, step in enumerate((warmup, warmup + between)):
            wait(lambda: progress(out) >= step, f"{name} step {step}", proc)
            proc.send_signal(signal.SIGUSR1)
            wait(lambda: len(list(snaps.glob("*.json"))) > k, f"{name} snapshot {k + 1}", proc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return RunDir.open(work / "run")


def float_chunks(rd: RunDir, snap_id: str) -> dict[str, tuple[bytes, list[tuple[str, memoryview]]]]:
    """{buffer name: (dtype, [(chunk id, bytes)])} of the snapshot's float buffers."""
    out = {}
    for name, rec in rd.load_manifest(snap_id)["buffers"].items():
        dtype = rec.get("dtype") or ""
        if not dtype.startswith(codec.FLOATS) or not rec["nbytes"]:
            continue
        data = memoryview(rd.read_buffer(rec))
        chunks, pos = [], 0
        for cid, nb in rec["chunks"]:
            chunks.append((cid, data[pos : pos + nb]))
            pos += nb
        out[name] = (dtype, chunks)
    return out


def encode(name: str, data, typesize: int) -> int:
    import blosc2

    b2, filters = CODECS[name]
    return len(blosc2.compress2(data, codec=blosc2.Codec[b2], clevel=1, filters=[blosc2.Filter[f] for f in filters],
                                filters_meta=[0] * len(filters), typesize=typesize, nthreads=1))


def measure(rd: RunDir) -> dict:
    ids = rd.snapshot_ids()
    first, second = float_chunks(rd, ids[0]), float_chunks(rd, ids[1])
    known = {cid for _, chunks in first.values() for cid, _ in chunks}
    sizes = {"raw": 0, **{k: 0 for k in CODECS}, **{f"xor {k}": 0 for k in CODECS}}
    seconds = {k: 0.0 for k in CODECS}
    total, written = 0, []  # the chunks a writer would write: (dtype, bytes)
    for name, (dtype, chunks) in second.items():
        base = first.get(name)
        for i, (cid, data) in enumerate(chunks):
            total += len(data)
            if cid in known:
                continue
            written.append((dtype, data))
            sizes["raw"] += len(data)
            for k in CODECS:
                t0 = time.perf_counter()
                sizes[k] += min(len(data), encode(k, data, 4))
                seconds[k] += time.perf_counter() - t0
            old = base[1][i][1] if base is not None and i < len(base[1]) and len(base[1][i][1]) == len(data) else None
            xored = data if old is None else (np.frombuffer(data, np.uint8) ^ np.frombuffer(old, np.uint8)).data
            for k in CODECS:
                sizes[f"xor {k}"] += min(len(data), encode(k, xored, 4))
    new = sizes["raw"]
    auto = {}
    for d in DISKS_GBPS:  # this machine's speeds, per byte of incompressible data, as the writer learns them
        chooser = Chooser(threads=len(os.sched_getaffinity(0)), disk_bps=d * 1e9)
        for name, measured in (("lz4", "lz4+bitshuffle"), ("zstd", "zstd+shuffle")):
            chooser.speed[name] = new / max(seconds[measured], 1e-9) / _faster(sizes[measured] / max(new, 1))
        auto[d] = 0
        for dtype, data in written:
            choice = chooser.pick(data, dtype, 4)
            auto[d] += len(data) if choice is None else min(len(data), len(codec.compress(data, dtype, 4, choice.codec)))
    return {"total": total, "new": new, "sizes": sizes, "seconds": seconds, "auto": auto}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=30, help="steps before the first snapshot")
    parser.add_argument("--between", type=int, default=20, help="steps between the two snapshots")
    parser.add_argument("--dir", default="/work/bench-tmp")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = args.out or str(REPO / "tools" / "results" / f"bench_codec-cpu-{stamp}.txt")
    import blosc2

    say = Tee(out)
    commit = git_commit(REPO)
    say(f"# bench_codec {datetime.datetime.now().isoformat(timespec='seconds')}; gpusnap {commit}, blosc2 {blosc2.__version__}; "
        f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.2f}")
    say(f"# command: python tools/bench_codec.py --warmup {args.warmup} --between {args.between}")
    os.makedirs(args.dir, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="bench_codec-", dir=args.dir))
    try:
        for name, prog in PROGRAMS.items():
            work = scratch / name
            work.mkdir()
            rd = two_snapshots(name, prog, work, args.warmup, args.between)
            m = measure(rd)
            raw = m["sizes"]["raw"]
            say()
            say(f"== {name} ({' '.join(prog[1:5])}): state {m['total'] / 1e6:.1f} MB of floats, "
                f"{m['new'] / 1e6:.1f} MB changed {args.between} steps after the first snapshot ==")
            say(f"{'encoding':34}{'bytes written MB':>18}{'/ raw':>8}{'MB/s':>8}")
            for k, v in m["sizes"].items():
                speed = f"{m['new'] / m['seconds'][k] / 1e6:8.0f}" if k in m["seconds"] else ""
                say(f"{k:34}{v / 1e6:18.2f}{v / raw:8.3f}{speed}")
            for d, v in m["auto"].items():
                say(f"{f'auto @ {d:g} GB/s':34}{v / 1e6:18.2f}{v / raw:8.3f}")
            say(f"# load avg {os.getloadavg()[0]:.2f}")
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"raw output: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
