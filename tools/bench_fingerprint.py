"""Benchmark of the dirty-chunk fingerprint against copies of the same bytes, in one run.

    python tools/bench_fingerprint.py [--backend cuda|fake] [--gib G] [--chunk-mib M] [--repeat N]

Rows (best of N, each timed from launch to synchronize): the fingerprint of G GiB of device
memory, as one range and as 1,000 ranges in one launch (how staging calls it; each piece a
multiple of 512 bytes, as allocations are, so that no row falls back to byte loads); a
device-to-device copy of the same bytes (reads and writes them: the HBM anchor); a
device-to-host copy into registered host memory (the PCIe copy that a clean chunk saves). The
goal is a fingerprint at about the speed of reading the bytes once, far below the PCIe copy:
the last lines give the fingerprint's GB/s against the device's copy bandwidth (bytes read and
written) and whether the kernel agrees with the NumPy reference on random bytes, as one range
and as pieces that start at odd addresses. On the fake backend (no GPU) the numbers only show
that the tool runs.
"""

from __future__ import annotations

import argparse
import mmap
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from gpusnap.device import fingerprint as fp  # noqa: E402
from gpusnap.device import open_backend  # noqa: E402
from gpusnap.device.calls import check  # noqa: E402


def best_s(repeat: int, run, sync) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cuda", "fake"), default="cuda")
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--chunk-mib", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    if opts.backend == "fake":
        from gpusnap.device import fake

        fake.reset(devices=1, device_bytes=int(opts.gib * 2 * (1 << 30)) + (64 << 20))
        cu = fake.driver
    else:
        from gpusnap.device.cuda import load_driver

        cu = load_driver()
    # Be the program: device 0's primary context, current, with the bytes to fingerprint.
    dev = check("cuDeviceGet", cu.cuDeviceGet(0))
    check("cuCtxPushCurrent", cu.cuCtxPushCurrent(check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))))
    nbytes = int(opts.gib * (1 << 30)) // 4 * 4
    chunk_bytes = int(opts.chunk_mib * (1 << 20))
    src = int(check("cuMemAlloc", cu.cuMemAlloc(nbytes)))
    dst = int(check("cuMemAlloc", cu.cuMemAlloc(nbytes)))
    check("cuMemsetD32", cu.cuMemsetD32(src, 0x3F800000, nbytes // 4))
    check("cuCtxSynchronize", cu.cuCtxSynchronize())  # the memset returns before it runs
    backend = open_backend(opts.backend)
    host = mmap.mmap(-1, nbytes)
    host_address = np.frombuffer(host, dtype=np.uint8).ctypes.data
    backend.register_host(host_address, nbytes)
    prints = np.zeros((fp.chunk_count(nbytes, chunk_bytes), fp.FINGERPRINT_NBYTES), np.uint8)
    sync = lambda: backend.synchronize(0)  # noqa: E731
    stream = backend.stream(0)

    def copy_on_device():
        with backend.on(0):
            check("cuMemcpyDtoDAsync", cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream))

    # The same bytes as 1,000 tensors, one launch for all of them, as staging fingerprints a device;
    # 512-byte multiples, as allocations are: an unaligned piece would be read a byte at a time.
    piece = nbytes // 1000 // 512 * 512
    pieces = [(src + i * piece, piece) for i in range(1000)]
    rows = [
        ("fingerprint", best_s(opts.repeat, lambda: backend.fingerprint(0, src, nbytes, chunk_bytes, prints), sync)),
        ("fingerprint, 1000 ranges", best_s(opts.repeat, lambda: backend.fingerprint_ranges(0, pieces, chunk_bytes), sync)),
        ("device->device copy", best_s(opts.repeat, copy_on_device, sync)),
        ("device->host copy", best_s(opts.repeat, lambda: backend.copy_to_host(0, src, host_address, nbytes), sync)),
    ]
    info = backend.device(0)
    print(f"{info.name} ({info.arch}), {nbytes / (1 << 30):.2f} GiB, chunks of {chunk_bytes >> 10} KiB, best of {opts.repeat}")
    base = rows[0][1]
    for name, seconds in rows:
        print(f"  {name:<24} {seconds * 1e3:10.2f} ms  {nbytes / seconds / 1e9:8.1f} GB/s  fingerprint/this {base / seconds:6.2f}")
    copy_s = dict(rows)["device->device copy"]
    print(f"fingerprint {nbytes / base / 1e9:.1f} GB/s against the device's copy bandwidth {2 * nbytes / copy_s / 1e9:.1f} GB/s "
          f"(read + written): {nbytes / base / (2 * nbytes / copy_s):.2f}x")
    print(f"agrees with the NumPy reference: {agreement(cu, backend, dst, min(nbytes, 64 << 20), chunk_bytes)}")
    backend.close()


def agreement(cu, backend, ptr: int, nbytes: int, chunk_bytes: int) -> str:
    """Random bytes at ``ptr``, fingerprinted as one range and as pieces at odd offsets, against
    the NumPy definition."""
    data = np.frombuffer(np.random.default_rng(23).bytes(nbytes), np.uint8)
    check("cuMemcpyHtoD", cu.cuMemcpyHtoD(ptr, data.ctypes.data, nbytes))
    check("cuCtxSynchronize", cu.cuCtxSynchronize())  # the copy may still be in flight; gpusnap's stream is another
    cuts = [0, 13, 4096 + 5, nbytes // 3 + 1, nbytes]
    ranges = [(ptr, nbytes)] + [(ptr + a, b - a) for a, b in zip(cuts, cuts[1:])]
    got = backend.fingerprint_ranges(0, ranges, chunk_bytes)
    backend.synchronize(0)
    expected = np.concatenate([fp.reference(data[start - ptr : start - ptr + n], chunk_bytes) for start, n in ranges])
    rows = len(expected)
    same = int((got == expected).all(axis=1).sum())
    return f"{'yes' if same == rows else 'NO'}: {same}/{rows} chunks of {nbytes >> 20} MiB equal (one range and {len(cuts) - 1} odd pieces)"


if __name__ == "__main__":
    main()
