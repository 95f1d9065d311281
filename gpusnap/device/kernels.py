"""gpusnap's CUDA kernels: their source (next to this module) and their compilation by NVRTC.

NVRTC is a compiler library and needs no GPU, so CI compiles every kernel for the
architectures gpusnap supports. At run time the CUDA backend compiles once per device, for the
device's own compute capability, to a CUBIN (no PTX JIT in the driver).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpusnap.device.calls import check, loading
from gpusnap.errors import KernelBuildError

FINGERPRINT_SOURCE = "fingerprint.cu"
FINGERPRINT_ACCUMULATE = "gpusnap_fp_accumulate"
FINGERPRINT_FINALIZE = "gpusnap_fp_finalize"
# Threads per block of the accumulate kernel; must be a multiple of 32 (the reduction is
# per warp). The Python side knows it to size the grid.
FINGERPRINT_THREADS = 256
FINGERPRINT_WORDS_PER_THREAD = 8
# Blocks per fingerprint launch to aim for: a few waves on the largest GPUs (an H100 holds 132
# SMs x 8 blocks of 256 threads at once). Fewer blocks per chunk mean fewer atomics on the same
# accumulator; enough blocks keep every SM loading. A starting point, not yet measured.
FINGERPRINT_TARGET_BLOCKS = 4096


@dataclass(frozen=True)
class Image:
    """A compiled kernel module: ``kind`` is "cubin" (``arch`` sm_XX) or "ptx" (compute_XX)."""

    kind: str
    arch: str
    data: bytes
    log: str


@cache
def source(name: str = FINGERPRINT_SOURCE) -> str:
    return resources.files("gpusnap.device").joinpath(name).read_text()


def _nvrtc():
    with loading("NVRTC", "install the NVRTC wheel that matches cuda-bindings (pip install nvidia-cuda-nvrtc)"):
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()  # loads libnvrtc; a missing library raises here, not mid-compile
    return nvrtc


def compile_kernel(arch: str, name: str = FINGERPRINT_SOURCE) -> Image:
    """Compile kernel source ``name`` for ``arch``: "sm_90" gives a CUBIN, "compute_90" PTX.
    Once per (source text, arch) in a process: devices of one architecture share the build."""
    if not (arch.startswith("sm_") or arch.startswith("compute_")):
        raise ValueError(f"arch must be sm_XX or compute_XX, not {arch!r}")
    return _compile(source(name), name, arch)


@cache
def _compile(text: str, name: str, arch: str) -> Image:
    nvrtc = _nvrtc()
    prog = check("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []))
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--std=c++17"]
        status = nvrtc.nvrtcCompileProgram(prog, len(options), options)[0]
        log_size = check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * log_size
        check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(prog, log))
        log_text = log.rstrip(b"\0 ").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            first = next((line for line in log_text.splitlines() if "error" in line), status.name)
            raise KernelBuildError(f"NVRTC could not compile {name} for {arch}: {first.strip()}")
        kind = "cubin" if arch.startswith("sm_") else "ptx"
        size_call, get_call = ("nvrtcGetCUBINSize", "nvrtcGetCUBIN") if kind == "cubin" else ("nvrtcGetPTXSize", "nvrtcGetPTX")
        size = check(size_call, getattr(nvrtc, size_call)(prog))
        data = b" " * size
        check(get_call, getattr(nvrtc, get_call)(prog, data))
        return Image(kind, arch, data, log_text)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def nvrtc_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    return check("nvrtcVersion", nvrtc.nvrtcVersion())
