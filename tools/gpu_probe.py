"""What the GPU check (tools/gpu_check.sh) asks a machine: its versions, and what its GPU does where
the device code makes an assumption about CUDA (docs/gpu.md), one verdict per line.

    python tools/gpu_probe.py env                 GPU, driver, CUDA, torch, cuda-bindings, cuda-core,
                                                  CuPy and NVRTC versions, the commit
    python tools/gpu_probe.py probes [--fake]     each probe prints "probe NAME: VERDICT (details)"
    python tools/gpu_probe.py first-alloc         one fresh process's first cuMemAlloc address
    python tools/gpu_probe.py allocator           what torch's memory snapshot finds of live storages
                                                  under this process's PYTORCH_CUDA_ALLOC_CONF

--fake (and GPUSNAP_DEVICE=fake) asks the fake GPU instead: what it answers is what the fake
models, so a dry run shows every probe working before a GPU is spent on it. Probes:

- dontfork: VmFlags (/proc/self/smaps; "dc" is do-not-fork) of the registered staging arena,
  a pinned torch tensor and cuMemAllocHost memory: what a forked writer may not read in place;
- orphaned-pages: a registered memfd range with a hole punched in it, then a device->host copy:
  does the copy land in the file (the pages followed) or in the orphans (lost)?
- stream-race: a "synchronous" memset and a pageable host->device copy, each followed at once by
  a read on a non-blocking stream: how often the read overtook them;
- address-range: cuMemGetAddressRange of a 10,000-byte allocation;
- managed-ordinal: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL of managed memory (cuMemAllocManaged, a
  cuda.core ManagedMemoryResource, one that prefers the host);
- allocator: whether torch.cuda.memory._snapshot() holds every live storage by default, with
  expandable_segments:True, and what it does under backend:cudaMallocAsync (one process each);
- first-alloc: the first cuMemAlloc address in two fresh processes (the same: restarts get
  their old addresses back);
- fingerprint: NVRTC's version and the fingerprint kernel's self-check on device 0.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.metadata
import mmap
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from gpusnap.device.calls import check  # noqa: E402

MiB = 1 << 20


def fake_mode() -> bool:
    return os.environ.get("GPUSNAP_DEVICE") == "fake"


def driver():
    """cuda.bindings.driver, real or fake, initialised; device 0's primary context current."""
    if fake_mode():
        from gpusnap.device import fake

        fake.install()
    from cuda.bindings import driver as cu

    check("cuInit", cu.cuInit(0))
    dev = check("cuDeviceGet", cu.cuDeviceGet(0))
    check("cuCtxPushCurrent", cu.cuCtxPushCurrent(check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))))
    return cu


def backend():
    from gpusnap.device import open_backend

    return open_backend("fake" if fake_mode() else "cuda")


def say(name: str, verdict: str, details: str = "") -> None:
    print(f"probe {name}: {verdict}" + (f" ({details})" if details else ""), flush=True)


# ---- env


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(*cmd) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"? ({exc})"
    return (done.stdout or done.stderr).strip() or f"? (exit {done.returncode})"


def env() -> None:
    lines = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
             "commit": os.environ.get("GPUSNAP_COMMIT") or run("git", "-C", str(REPO), "rev-parse", "HEAD"),
             "host": f"{platform.node()}, {platform.platform()}, {os.cpu_count()} CPUs",
             "python": sys.version.split()[0],
             "gpu (nvidia-smi)": run("nvidia-smi", "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,"
                                                   "pcie.link.width.max", "--format=csv,noheader")}
    try:
        import psutil

        lines["memory"] = f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {psutil.virtual_memory().available / 2**30:.0f} available"
    except ImportError:
        pass
    lines["disk free (cwd)"] = f"{shutil.disk_usage('.').free / 2**30:.0f} GiB"
    try:  # before the fake driver is installed: NVRTC's module reads the real one
        from gpusnap.device.kernels import nvrtc_version

        lines["NVRTC"] = ".".join(map(str, nvrtc_version()))
    except Exception as exc:  # noqa: BLE001 - a missing NVRTC is what this line is for
        lines["NVRTC"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        cu = driver()
        lines["CUDA driver API"] = str(check("cuDriverGetVersion", cu.cuDriverGetVersion()))
        lines["devices"] = str(check("cuDeviceGetCount", cu.cuDeviceGetCount()))
    except Exception as exc:  # noqa: BLE001 - reported, not fatal: the rest still tells something
        lines["CUDA driver API"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        import torch

        cuda = torch.cuda.is_available()
        lines["torch"] = f"{torch.__version__}, CUDA {torch.version.cuda}, available {cuda}" + (
            f", {torch.cuda.get_device_name(0)} sm_{''.join(map(str, torch.cuda.get_device_capability(0)))}" if cuda else "")
    except ImportError:
        lines["torch"] = "not installed"
    for package in ("cuda-bindings", "cuda-core", "cuda-python", "cupy-cuda13x", "cupy-cuda12x", "nvidia-cuda-nvrtc",
                    "blosc2", "numpy", "xxhash", "psutil", "pytest-xdist", "pytest-timeout"):
        lines[package] = version(package)
    lines["GPUSNAP_DEVICE"] = os.environ.get("GPUSNAP_DEVICE", "cuda")
    for key, value in lines.items():
        print(f"{key}: {value}")


# ---- probes


def probe_dontfork(cu, gpu) -> None:
    from gpusnap.stage.arena import Arena
    from gpusnap.stage.unforked import vmflags

    arena = Arena(capacity=64 * MiB)
    arena.reserve(4 * MiB, "device")
    offset, nbytes = arena.pinned
    gpu.register_host(arena.address + offset, nbytes)
    found = {"registered arena": vmflags(arena.address + offset)}
    try:
        import torch

        if torch.cuda.is_available():
            pinned = torch.empty(MiB, dtype=torch.uint8, pin_memory=True)
            found["pinned tensor"] = vmflags(pinned.data_ptr())
    except ImportError:
        pass
    host = check("cuMemAllocHost", cu.cuMemAllocHost(MiB))
    found["cuMemAllocHost"] = vmflags(int(host))
    check("cuMemFreeHost", cu.cuMemFreeHost(host))
    gpu.unregister_host(arena.address + offset)
    say("dontfork", "; ".join(f"{name} {'do-not-fork' if 'dc' in flags.split() else 'forked'}" for name, flags in found.items()),
        "; ".join(f"{name}: {flags}" for name, flags in found.items()))


def probe_orphaned_pages(cu, gpu) -> None:
    from gpusnap.rawmem import punch_hole

    nbytes, page = 8 * MiB, mmap.PAGESIZE
    fd = os.memfd_create("gpusnap-probe")
    os.ftruncate(fd, nbytes)
    shared = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
    address = ctypes.addressof(ctypes.c_char.from_buffer(shared))
    ptr = int(check("cuMemAlloc", cu.cuMemAlloc(nbytes)))
    check("cuMemsetD8", cu.cuMemsetD8(ptr, 7, nbytes))
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    gpu.register_host(address, nbytes)
    check("cuMemcpyDtoH", cu.cuMemcpyDtoH(address, ptr, nbytes))
    before = os.pread(fd, nbytes, 0)
    punch_hole(fd, MiB, MiB)  # 256 pages replaced under the registration
    check("cuMemsetD8", cu.cuMemsetD8(ptr, 9, nbytes))
    check("cuMemcpyDtoH", cu.cuMemcpyDtoH(address, ptr, nbytes))
    after = np.frombuffer(os.pread(fd, nbytes, 0), np.uint8)
    gpu.unregister_host(address)
    check("cuMemFree", cu.cuMemFree(ptr))
    lost = int((after[MiB : 2 * MiB] != 9).sum())
    kept = int((np.delete(after, np.s_[MiB : 2 * MiB]) == 9).sum())
    verdict = ("orphaned: a copy into pages punched under the registration is lost, as the fake models it" if lost
               else "followed: the copy landed in the file's new pages (the fake is stricter than this GPU)")
    say("orphaned-pages", verdict, f"first copy in the file {before == bytes([7]) * nbytes}; after the hole: "
        f"{lost:,} of {MiB // page * page:,} bytes of the hole lost, {kept:,} of {nbytes - MiB:,} bytes elsewhere landed")
    del after
    shared.close()
    os.close(fd)


def probe_stream_race(cu, gpu, tries: int = 20) -> None:
    nbytes = 8 * MiB if fake_mode() else 512 * MiB  # long enough to still run when the read is issued
    ptr = int(check("cuMemAlloc", cu.cuMemAlloc(nbytes)))
    host = check("cuMemAllocHost", cu.cuMemAllocHost(4096))
    view = np.frombuffer((ctypes.c_char * 4096).from_address(int(host)), np.uint8)
    fast = check("cuStreamCreate", cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    source = np.zeros(nbytes, np.uint8)
    overtook = {"memset": 0, "pageable copy": 0}
    for i in range(tries):
        value = 1 + 2 * i  # never the bytes an earlier try left there
        check("cuCtxSynchronize", cu.cuCtxSynchronize())
        check("cuMemsetD8", cu.cuMemsetD8(ptr, value, nbytes))  # returns before it runs
        check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(int(host), ptr + nbytes - 4096, 4096, fast))
        check("cuStreamSynchronize", cu.cuStreamSynchronize(fast))
        overtook["memset"] += int(view[0] != value)
        check("cuCtxSynchronize", cu.cuCtxSynchronize())
        source[-4096:] = value + 1
        check("cuMemcpyHtoD", cu.cuMemcpyHtoD(ptr, source.ctypes.data, nbytes))  # may return before it lands
        check("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(int(host), ptr + nbytes - 4096, 4096, fast))
        check("cuStreamSynchronize", cu.cuStreamSynchronize(fast))
        overtook["pageable copy"] += int(view[0] != value + 1)
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    check("cuStreamDestroy", cu.cuStreamDestroy(fast))
    check("cuMemFreeHost", cu.cuMemFreeHost(host))
    check("cuMemFree", cu.cuMemFree(ptr))
    say("stream-race", "a non-blocking stream overtook " + ", ".join(f"a {what} {n}/{tries} times" for what, n in overtook.items()),
        f"{nbytes // MiB} MiB each; gpusnap orders its stream after the program's work with a synchronize")


def probe_address_range(cu, gpu) -> None:
    ptr = int(check("cuMemAlloc", cu.cuMemAlloc(10_000)))
    base, size = check("cuMemGetAddressRange", cu.cuMemGetAddressRange(ptr))
    check("cuMemFree", cu.cuMemFree(ptr))
    say("address-range", "exact" if int(size) == 10_000 else f"rounded up to {int(size):,} bytes",
        f"base {int(base):#x} == allocation {int(base) == ptr}; staging uses the size the program asked for")


def probe_managed_ordinal(cu, gpu) -> None:
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    found = {}
    ptr = int(check("cuMemAllocManaged", cu.cuMemAllocManaged(4096, int(cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL))))
    found["cuMemAllocManaged"] = int(check("cuPointerGetAttribute", cu.cuPointerGetAttribute(attr, ptr)))
    check("cuMemFree", cu.cuMemFree(ptr))
    try:
        import cuda.core as core

        device = core.Device(0)
        device.set_current()
        stream = device.create_stream()
        kinds = {"cuda.core default pool": None,
                 "cuda.core pool preferring the host": core.ManagedMemoryResourceOptions(preferred_location=-1)}
        for name, options in kinds.items():
            try:
                buffer = core.ManagedMemoryResource(options).allocate(4096, stream=stream)
                stream.sync()
                found[name] = int(check("cuPointerGetAttribute", cu.cuPointerGetAttribute(attr, int(buffer.handle))))
                buffer.close(stream)
            except Exception as exc:  # noqa: BLE001 - one kind of pool this cuda.core or GPU lacks
                found[name] = f"n/a ({type(exc).__name__}: {exc})"
        stream.sync()
    except ImportError as exc:
        found["cuda.core"] = f"n/a ({exc})"
    say("managed-ordinal", ", ".join(f"{name} {value}" for name, value in found.items()),
        "-1 names no device: staging and restore go through the current one")


def probe_allocator(cu, gpu) -> None:
    try:
        import torch
    except ImportError:
        return say("allocator", "skipped", "torch is not installed")
    if not torch.cuda.is_available():
        return say("allocator", "skipped", "torch has no CUDA here")
    for conf in ("", "expandable_segments:True", "backend:cudaMallocAsync"):
        done = subprocess.run([sys.executable, __file__, "allocator"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf})
        answer = (done.stdout.strip().splitlines() or [f"no answer (exit {done.returncode}): {done.stderr.strip()[-300:]}"])[-1]
        say("allocator", f"{conf or 'default'}: {answer}")


def allocator() -> None:
    """In a fresh process: live storages of several sizes and a view, then torch_ranges()."""
    import torch

    from gpusnap.stage.sources import torch_ranges

    tensors = [torch.ones(n, dtype=torch.uint8, device="cuda") for n in (1 << 10, (1 << 20) + 3, 20 << 20, 100 << 20)]
    tensors.append(tensors[2][5:])
    torch.cuda.synchronize()
    try:
        ranges = torch_ranges()
    except Exception as exc:  # noqa: BLE001 - what it raises is the answer
        print(f"_snapshot() raises {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return
    found = sum(any(r.base <= t.data_ptr() and t.data_ptr() + t.untyped_storage().nbytes() <= r.base + r.nbytes
                    for r in ranges) for t in tensors)
    print(f"{found}/{len(tensors)} live storages inside the {len(ranges)} active blocks it lists")


def probe_first_alloc(cu, gpu) -> None:
    answers = []
    for _ in range(2):
        done = subprocess.run([sys.executable, __file__, "first-alloc"], capture_output=True, text=True, timeout=120)
        answers.append(done.stdout.strip() or f"no answer (exit {done.returncode}): {done.stderr.strip()[-200:]}")
    say("first-alloc", "the same in both processes" if answers[0] == answers[1] else "different", " vs ".join(answers))


def first_alloc() -> None:
    cu = driver()
    print(f"{int(check('cuMemAlloc', cu.cuMemAlloc(MiB))):#x}")


def probe_fingerprint(cu, gpu) -> None:
    if fake_mode():
        nvrtc = "not used (the fake's kernels are NumPy emulations)"
    else:
        from gpusnap.device.kernels import nvrtc_version

        nvrtc = ".".join(map(str, nvrtc_version()))
    agrees = gpu.fingerprint_agrees(0)
    say("fingerprint", "the kernel agrees with its definition" if agrees else "the kernel DISAGREES with its definition",
        f"NVRTC {nvrtc}, {gpu.device(0).name} {gpu.device(0).arch}")


PROBES = {"dontfork": probe_dontfork, "orphaned-pages": probe_orphaned_pages, "stream-race": probe_stream_race,
          "address-range": probe_address_range, "managed-ordinal": probe_managed_ordinal, "allocator": probe_allocator,
          "first-alloc": probe_first_alloc, "fingerprint": probe_fingerprint}


def probes(only: list[str]) -> int:
    cu, gpu = driver(), backend()
    failed = 0
    for name, probe in PROBES.items():
        if only and name not in only:
            continue
        try:
            probe(cu, gpu)
        except Exception as exc:  # noqa: BLE001 - one probe's failure is its verdict; the others still run
            failed += 1
            say(name, f"ERROR {type(exc).__name__}: {exc}", traceback.format_exc(limit=3).strip().replace("\n", " | "))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("env", "probes", "first-alloc", "allocator"))
    parser.add_argument("--fake", action="store_true", help="ask the fake GPU (GPUSNAP_DEVICE=fake)")
    parser.add_argument("--only", default="", help="probes to run, comma-separated (default: all)")
    args = parser.parse_args()
    if args.fake:
        os.environ["GPUSNAP_DEVICE"] = "fake"  # the processes it starts ask the fake too
    if args.what == "env":
        env()
    elif args.what == "probes":
        return probes([name for name in args.only.split(",") if name])
    elif args.what == "first-alloc":
        first_alloc()
    else:
        allocator()
    return 0


if __name__ == "__main__":
    sys.exit(main())
