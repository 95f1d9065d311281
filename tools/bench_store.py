"""Benchmark of the snapshot store against plain file writes and reads of the same bytes on the
same disk, in one run. Prints one table.

    python tools/bench_store.py [--quick] [--dir DIR] [--mib N] [--state-gib G] [--s3 URL | --moto]

Rows: write / read throughput per data kind and codec (ratio = store / plain file), bytes a
second snapshot writes for unchanged state and for 10% changed buffers, and the peak memory of
a writer storing a large state (child process, ru_maxrss above its state). With ``--s3 URL``
(endpoint and keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) or ``--moto`` (a local moto
server this run starts), object-store rows: a committed snapshot copied to the store (the
uploader's parallel multipart puts) and fetched back (parallel range reads), against one plain
put and get of the same bytes through the same library (obstore), and through fsspec+s3fs where
it is installed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from gpusnap.store import RunDir  # noqa: E402

ID = {"command": {"kind": "script", "target": "bench.py", "args": []}}


def data(kind: str, nbytes: int, rng) -> tuple[memoryview, str, int]:
    n = nbytes // 4
    if kind == "fp32 weights":
        a = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float32)
        return memoryview(a).cast("B"), "float32", 4
    if kind == "bf16 weights":
        a = (rng.standard_normal(n * 2, dtype=np.float32) * 0.02).view(np.uint32) >> 16
        return memoryview(a.astype(np.uint16)).cast("B"), "bfloat16", 2
    if kind == "Adam exp_avg_sq":
        a = (rng.standard_normal(n, dtype=np.float32) ** 2 * 1e-6).astype(np.float32)
        return memoryview(a).cast("B"), "float32", 4
    if kind == "zero-heavy":
        a = np.zeros(n, np.float32)
        a[:: 97] = rng.standard_normal(len(a[::97]), dtype=np.float32)
        return memoryview(a).cast("B"), "float32", 4
    raise ValueError(kind)


def plain(path: pathlib.Path, mv: memoryview) -> tuple[float, float]:
    t = time.perf_counter()
    with open(path, "wb") as f:
        f.write(mv)
        f.flush()
        os.fsync(f.fileno())
    w = time.perf_counter() - t
    t = time.perf_counter()
    with open(path, "rb") as f:
        f.readinto(bytearray(len(mv)))
    return w, time.perf_counter() - t


def store_once(root: pathlib.Path, mv, dtype, ts, codec) -> tuple[float, float, float]:
    os.environ["GPUSNAP_CODEC"] = codec
    import importlib

    from gpusnap import knobs

    importlib.reload(knobs)  # the bench runs one process for both codecs
    shutil.rmtree(root, ignore_errors=True)
    rd = RunDir.create(root, ID)
    t = time.perf_counter()
    w = rd.begin_snapshot("000001")
    rec = w.put_buffer(mv, dtype=dtype, typesize=ts)
    w.commit({"buffers": {"x": rec}})
    wt = time.perf_counter() - t
    ratio = w.stats.bytes_new / max(1, w.stats.bytes_written)
    t = time.perf_counter()
    out = rd.read_buffer(rec)
    rt = time.perf_counter() - t
    assert out == mv
    return wt, rt, ratio


def incremental(root: pathlib.Path, nbuf: int, buf_bytes: int, rng) -> tuple[int, int, int]:
    shutil.rmtree(root, ignore_errors=True)
    rd = RunDir.create(root, ID)
    bufs = [bytearray(data("fp32 weights", buf_bytes, rng)[0]) for _ in range(nbuf)]

    def snap():
        before = du(root)
        w = rd.begin_snapshot(rd.next_snapshot_id())
        recs = {f"b{i}": w.put_buffer(b, dtype="float32", typesize=4) for i, b in enumerate(bufs)}
        w.commit({"buffers": recs})
        return du(root) - before

    first = snap()
    same = snap()
    for i in range(0, nbuf, 10):
        bufs[i][:] = data("fp32 weights", buf_bytes, rng)[0]
    changed = snap()
    return first, same, changed


def du(root: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


CHILD = """
import os, resource, sys, numpy as np
sys.path.insert(0, sys.argv[3])
from gpusnap.store import RunDir
nbytes = int(sys.argv[2])
state = np.empty(nbytes // 4, np.float32)
rng = np.random.default_rng(1)
step = 64 << 20
for i in range(0, len(state), step // 4):
    state[i:i + step // 4] = rng.standard_normal(min(step // 4, len(state) - i), dtype=np.float32) * 0.02
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rd = RunDir.create(sys.argv[1], {"command": {"kind": "script", "target": "bench.py", "args": []}})
w = rd.begin_snapshot("000001")
rec = w.put_buffer(memoryview(state).cast("B"), dtype="float32", typesize=4)
w.commit({"buffers": {"s": rec}})
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(base * 1024, peak * 1024, w.stats.bytes_written)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--mib", type=int, default=None, help="MiB per throughput case (default 256, quick 64)")
    ap.add_argument("--state-gib", type=float, default=None, help="state size for the memory row (default 4, quick 1)")
    ap.add_argument("--s3", default=None, metavar="URL", help="object-store rows against this s3:// prefix")
    ap.add_argument("--moto", action="store_true", help="object-store rows against a local moto server started here")
    args = ap.parse_args()
    mib = args.mib or (64 if args.quick else 256)
    state_gib = args.state_gib or (1.0 if args.quick else 4.0)
    base = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="gpusnap-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    warm, dtype, ts = data("fp32 weights", 8 << 20, rng)
    store_once(base / "run", warm, dtype, ts, "zstd")  # imports and thread pools, not measured
    print(f"# bench_store: {mib} MiB per case, {os.cpu_count()} cores, dir {base}", flush=True)
    for kind in ("fp32 weights", "bf16 weights", "Adam exp_avg_sq", "zero-heavy"):
        mv, dtype, ts = data(kind, mib << 20, rng)
        pw, pr = plain(base / "plain.bin", mv)
        for codec in ("zstd", "lz4"):
            wt, rt, ratio = store_once(base / "run", mv, dtype, ts, codec)
            gb = len(mv) / 1e9
            rows.append((kind, codec, f"{ratio:.2f}x", f"{gb / wt:.2f}", f"{gb / pw:.2f}", f"{pw / wt:.2f}",
                         f"{gb / rt:.2f}", f"{gb / pr:.2f}", f"{pr / rt:.2f}"))
        os.unlink(base / "plain.bin")
    head = ("data", "codec", "compr", "write GB/s", "plain", "ratio", "read GB/s", "plain", "ratio")
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(x) for c, x in zip(r, w)))

    os.environ["GPUSNAP_CODEC"] = "zstd"
    nbuf, buf = (20, 4 << 20) if args.quick else (40, 8 << 20)
    first, same, changed = incremental(base / "inc", nbuf, buf, rng)
    print(f"incremental ({nbuf} fp32 buffers x {buf >> 20} MiB, disk bytes added per snapshot):")
    print(f"  first snapshot        {first:>12,d} B")
    print(f"  unchanged state       {same:>12,d} B  = {100 * same / first:.3f}% of first (target <= 1%)")
    print(f"  10% buffers changed   {changed:>12,d} B  = {100 * changed / first:.2f}% of first (target <= 12%)")

    nbytes = int(state_gib * (1 << 30))
    shutil.rmtree(base / "mem", ignore_errors=True)
    out = subprocess.run([sys.executable, "-c", CHILD, str(base / "mem"), str(nbytes),
                          str(pathlib.Path(__file__).resolve().parents[1])],
                         capture_output=True, text=True, check=True).stdout.split()
    b, p, written = map(int, out)
    print(f"writer memory for a {state_gib:g} GiB fp32 state: peak RSS {p / 2**20:.0f} MiB, state alone "
          f"{b / 2**20:.0f} MiB, writer overhead {(p - b) / 2**20:.0f} MiB (window knob "
          f"{int(os.environ.get('GPUSNAP_WRITER_WINDOW_BYTES', 256 << 20)) >> 20} MiB); wrote {written / 2**30:.2f} GiB")
    if args.s3 or args.moto:
        object_rows(base, mib, rng, args.s3)
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


def _moto() -> tuple[subprocess.Popen, str]:
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint, timeout=2).read()
            break
        except OSError:
            time.sleep(0.2)
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/gpusnap-bench", method="PUT"), timeout=10).read()
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")
    return server, f"s3://gpusnap-bench/run-{os.getpid()}"


def object_rows(base: pathlib.Path, mib: int, rng, url: str | None) -> None:
    import obstore

    from gpusnap.store import levels, location
    from gpusnap.store.objects import open_backend

    server = None
    if url is None:
        server, url = _moto()
    try:
        mv, dtype, ts = data("fp32 weights", mib << 20, rng)
        shutil.rmtree(base / "obj", ignore_errors=True)
        rd = RunDir.create(base / "obj", ID)
        w = rd.begin_snapshot(rd.next_snapshot_id())
        rec = w.put_buffer(mv, dtype=dtype, typesize=ts)
        w.commit({"buffers": {"b": rec}})
        shared = open_backend(url)
        levels.ensure_run(shared, rd)
        report = {"bytes": 0, "seconds": 0.0}
        t = time.perf_counter()
        levels.copy_snapshot(rd, shared, "000001", set(), report)
        up_s = time.perf_counter() - t
        nbytes = report["bytes"]
        payload = os.urandom(nbytes)  # the same number of bytes, as one plain object
        store = shared.inner._store
        t = time.perf_counter()
        obstore.put(store, "plain.bin", payload, chunk_size=8 << 20, max_concurrency=8)
        plain_up = time.perf_counter() - t
        t = time.perf_counter()
        levels.fetch(location.open_shared(url), base / "fetched")
        down_s = time.perf_counter() - t
        t = time.perf_counter()
        got = obstore.get(store, "plain.bin").bytes()
        with open(base / "plain-get.bin", "wb") as f:  # a restart's bytes must reach the disk too
            f.write(got)
            os.fsync(f.fileno())
        plain_down = time.perf_counter() - t
        mb = nbytes / 2**20
        print(f"object store {url} ({os.environ.get('AWS_ENDPOINT_URL', 'AWS')}), a {mib} MiB fp32 snapshot, "
              f"{mb:.0f} MiB of packs:")
        print(f"  upload (uploader)   {mb / up_s:8.1f} MiB/s   plain put (obstore) {mb / plain_up:8.1f} MiB/s   "
              f"ratio {plain_up / up_s:.2f}")
        print(f"  fetch (restart)     {mb / down_s:8.1f} MiB/s   plain get+write     {mb / plain_down:8.1f} MiB/s   "
              f"ratio {plain_down / down_s:.2f}")
        try:
            import s3fs
        except ImportError:
            return
        fs = s3fs.S3FileSystem()
        key = url.split("://", 1)[1] + "/plain-s3fs.bin"
        t = time.perf_counter()
        fs.pipe_file(key, payload)
        s3fs_up = time.perf_counter() - t
        t = time.perf_counter()
        fs.cat_file(key)
        s3fs_down = time.perf_counter() - t
        print(f"  fsspec+s3fs         put {mb / s3fs_up:8.1f} MiB/s   get {mb / s3fs_down:8.1f} MiB/s (the library not chosen)")
    finally:
        if server is not None:
            server.terminate()


if __name__ == "__main__":
    main()
