"""The device map: where a tensor or array saved on a device goes in this process.

- ``GPUSNAP_DEVICE_MAP`` ("1:0,2:cpu") where it names the saved ordinal;
- else the same ordinal, when this process sees that many GPUs;
- else the ordinal modulo the GPUs it sees (a snapshot of 4 GPUs restored on 2);
- the CPU where it sees none (the replayed program chose the CPU too, or the merge copies into
  whatever device its live counterpart is on).
"""

from __future__ import annotations

import sys

from gpusnap import knobs
from gpusnap.errors import RestoreError


def target(saved: str, gpus: int | None = None) -> str:
    """The device for a tensor saved on ``saved`` ("cuda:1"); ``gpus``: how many GPUs the
    library that will hold it sees (default: torch's count, or CuPy's)."""
    kind, _, index = saved.partition(":")
    ordinal = int(index or 0)
    mapped = knobs.DEVICE_MAP.get(ordinal)
    count = 0
    if kind == "cuda" and mapped != "cpu":
        count = _gpus(sys.modules.get("torch")) if gpus is None else gpus
    if not count:
        return "cpu"
    if mapped is not None:
        if mapped >= count:
            raise RestoreError(f"GPUSNAP_DEVICE_MAP sends cuda:{ordinal} to cuda:{mapped}, and this process sees {count} GPUs",
                               hint="name a GPU this machine has (CUDA_VISIBLE_DEVICES applies), or cpu")
        return f"cuda:{mapped}"
    return f"cuda:{ordinal if ordinal < count else ordinal % count}"


def _gpus(torch) -> int:
    """GPUs this process sees: torch's count, or CuPy's for a program without torch."""
    if torch is not None:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver, no device: no GPU
        return 0
