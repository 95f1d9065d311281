"""Export the tensors of a snapshot's modules as a safetensors file, for use without the
program. The file is written here by hand (8-byte little-endian header length, JSON header,
data) so the store needs neither torch nor the safetensors package."""

from __future__ import annotations

import json
import pathlib
import struct

from gpusnap.errors import ExportError, StoreError
from gpusnap.store import atomic

# dtype name in the manifest -> (safetensors code, element size, numpy dtype with those bytes)
DTYPES = {
    "float64": ("F64", 8, "<f8"),
    "float32": ("F32", 4, "<f4"),
    "float16": ("F16", 2, "<f2"),
    "bfloat16": ("BF16", 2, "<u2"),  # numpy has no bfloat16; the bytes are what matter
    "float8_e4m3fn": ("F8_E4M3", 1, "u1"),
    "float8_e5m2": ("F8_E5M2", 1, "u1"),
    "int64": ("I64", 8, "<i8"),
    "int32": ("I32", 4, "<i4"),
    "int16": ("I16", 2, "<i2"),
    "int8": ("I8", 1, "i1"),
    "uint64": ("U64", 8, "<u8"),
    "uint32": ("U32", 4, "<u4"),
    "uint16": ("U16", 2, "<u2"),
    "uint8": ("U8", 1, "u1"),
    "bool": ("BOOL", 1, "u1"),
}


def _strip(dtype: str) -> str:
    return dtype[len("torch."):] if dtype.startswith("torch.") else dtype


def export_safetensors(rd, snap_id: str | None, out: pathlib.Path, module: str | None = None) -> dict:
    """Write the state_dict tensors of the snapshot's modules to ``out``; return
    {"snapshot", "tensors", "nbytes", "modules"}. Several modules: keys are "<module path>.<key>"."""
    import numpy as np

    m = rd.manifest(snap_id)
    modules = m.get("modules") or {}
    if module is not None:
        if module not in modules:
            raise StoreError(
                f"snapshot {m['id']} has no module at {module}",
                hint="the module paths are listed by `gpusnap inspect DIR`",
            )
        modules = {module: modules[module]}
    if not modules:
        raise StoreError(
            f"snapshot {m['id']} records no nn.Module state",
            hint="export needs a program whose state includes torch.nn.Module objects",
        )
    prefix = len(modules) > 1
    cache: dict[str, bytearray] = {}
    header: dict = {"__metadata__": {"format": "pt", "gpusnap_snapshot": m["id"]}}
    blobs = []
    offset = 0
    for mpath, state in sorted(modules.items()):
        for key, t in state.items():
            name = f"{mpath}.{key}" if prefix else key
            dtype = _strip(t["dtype"])
            if dtype not in DTYPES:
                raise ExportError(f"{name}: dtype {dtype} has no safetensors code")
            code, size, npdt = DTYPES[dtype]
            bname = t["buffer"]
            if bname not in cache:
                rec = m["buffers"].get(bname)
                if rec is None:
                    raise StoreError(f"{name} names buffer {bname}, which snapshot {m['id']} lacks")
                cache[bname] = rd.read_buffer(rec, snapshot=m["id"])
            raw = memoryview(cache[bname])[int(t.get("byte_offset", 0)):]  # a storage inside a device range
            shape = [int(s) for s in t["shape"]]
            stride = [int(s) for s in t.get("stride") or _contiguous(shape)]
            off = int(t.get("offset", 0))
            numel_storage = len(raw) // size
            if any(s == 0 for s in shape):
                arr = np.zeros(shape, dtype=npdt)
            else:
                last = off + sum((n - 1) * s for n, s in zip(shape, stride))
                if off < 0 or last >= numel_storage or any(s < 0 for s in stride):
                    raise ExportError(f"{name}: shape {shape}, stride {stride}, offset {off} run outside its buffer {bname}")
                base = np.frombuffer(raw, dtype=npdt, count=numel_storage)
                arr = np.lib.stride_tricks.as_strided(
                    base[off:], shape=shape, strides=[s * size for s in stride], writeable=False
                )
            data = np.ascontiguousarray(arr).tobytes()
            header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + len(data)]}
            blobs.append(data)
            offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # keep the data 8-byte aligned, as safetensors does
    atomic.write_file(pathlib.Path(out), [struct.pack("<Q", len(head)), head, *blobs], mode=0o644)
    return {"snapshot": m["id"], "tensors": len(blobs), "nbytes": offset, "modules": sorted(modules)}


def _contiguous(shape: list[int]) -> list[int]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return list(reversed(stride))
