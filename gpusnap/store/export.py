"""Export the tensors of a snapshot's modules as a safetensors file, for use without the
program. The ``safetensors`` package lays the file out (``safetensors.serialize`` takes each
tensor's dtype, shape and raw bytes: no torch), and ``gpusnap.atomic`` writes it."""

from __future__ import annotations

import math
import pathlib

from gpusnap.errors import ExportError, StoreError
from gpusnap import atomic

# dtype name in the manifest (safetensors' name too) -> (element size, numpy dtype with those bytes)
DTYPES = {
    "float64": (8, "<f8"),
    "float32": (4, "<f4"),
    "float16": (2, "<f2"),
    "bfloat16": (2, "<u2"),  # numpy has no bfloat16; the bytes are what matter
    "float8_e4m3fn": (1, "u1"),
    "float8_e5m2": (1, "u1"),
    "int64": (8, "<i8"),
    "int32": (4, "<i4"),
    "int16": (2, "<i2"),
    "int8": (1, "i1"),
    "uint64": (8, "<u8"),
    "uint32": (4, "<u4"),
    "uint16": (2, "<u2"),
    "uint8": (1, "u1"),
    "bool": (1, "u1"),
}


def _strip(dtype: str) -> str:
    return dtype[len("torch."):] if dtype.startswith("torch.") else dtype


def export_safetensors(rd, snap_id: str | None, out: pathlib.Path, module: str | None = None) -> dict:
    """Write the state_dict tensors of the snapshot's modules to ``out``; return
    {"snapshot", "tensors", "nbytes", "modules"}. Several modules: keys are "<module path>.<key>"."""
    import numpy as np
    import safetensors

    m = rd.manifest(snap_id)
    modules = m.get("modules") or {}
    if not isinstance(modules, dict):
        raise ExportError(f"snapshot {m['id']}: the manifest's table of modules is damaged")
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
    specs: dict = {}
    arrays = []  # alive until serialize has read them: a spec holds only an address
    nbytes = 0
    for mpath, state in sorted(modules.items()):
        if not isinstance(state, dict):
            raise ExportError(f"{mpath}: the manifest's record of the module is damaged")
        for key, t in state.items():
            name = f"{mpath}.{key}" if prefix else key
            if not isinstance(t, dict) or not isinstance(t.get("dtype"), str) or not isinstance(t.get("buffer"), str):
                raise ExportError(f"{name}: the manifest's record of the tensor is damaged")
            dtype = _strip(t["dtype"])
            if dtype not in DTYPES:
                raise ExportError(f"{name}: dtype {dtype} has no safetensors code")
            size, npdt = DTYPES[dtype]
            bname = t["buffer"]
            if bname not in cache:
                rec = m["buffers"].get(bname)
                if rec is None:
                    raise StoreError(f"{name} names buffer {bname}, which snapshot {m['id']} lacks")
                cache[bname] = rd.read_buffer(rec, snapshot=m["id"])
            shape, stride, off, byte_offset = _layout(name, t)
            if not 0 <= byte_offset <= len(cache[bname]):
                raise ExportError(f"{name}: its storage starts at byte {byte_offset} of its {len(cache[bname])}-byte buffer {bname}")
            raw = memoryview(cache[bname])[byte_offset:]  # a storage inside a device range
            numel_storage = len(raw) // size
            numel = math.prod(shape)
            if numel == 0:
                arr = np.zeros(shape, dtype=npdt)
            else:
                last = off + sum((n - 1) * s for n, s in zip(shape, stride))
                # More elements than the storage holds can only come from overlapping strides (a
                # stride of 0 repeats one element): no state_dict tensor is laid out so.
                if last >= numel_storage or numel > numel_storage:
                    raise ExportError(f"{name}: shape {shape}, stride {stride}, offset {off} do not fit the "
                                      f"{numel_storage} elements of its buffer {bname}")
                base = np.frombuffer(raw, dtype=npdt, count=numel_storage)
                arr = np.lib.stride_tricks.as_strided(
                    base[off:], shape=shape, strides=[s * size for s in stride], writeable=False
                )
            data = np.ascontiguousarray(arr)  # a contiguous tensor: its buffer's bytes, not a copy
            arrays.append(data)
            specs[name] = safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=data.ctypes.data, data_len=data.nbytes)
            nbytes += data.nbytes
    blob = safetensors.serialize(specs, metadata={"format": "pt", "gpusnap_snapshot": m["id"]})
    del arrays
    atomic.write_file(pathlib.Path(out), [blob], mode=0o644)
    return {"snapshot": m["id"], "tensors": len(specs), "nbytes": nbytes, "modules": sorted(modules)}


def _layout(name: str, t: dict) -> tuple[list[int], list[int], int, int]:
    """(shape, stride, element offset, byte offset) of a manifest's module tensor, refused
    (ExportError) unless each is a whole number that can lay out a tensor: sizes and offsets
    from 0, strides from 1 along every dimension longer than 1."""

    def counts(value, what: str) -> list[int]:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise ExportError(f"{name}: its {what} {value!r} is not a list of whole numbers")
        return value

    shape = counts(t.get("shape"), "shape")
    stride = counts(t.get("stride") or _contiguous(shape), "stride")
    off, byte_offset = counts([t.get("offset", 0), t.get("byte_offset", 0)], "offset")
    if len(stride) != len(shape):
        raise ExportError(f"{name}: stride {stride} does not match shape {shape}")
    if any(s == 0 and n > 1 for n, s in zip(shape, stride)):
        raise ExportError(f"{name}: stride {stride} repeats elements along a dimension of shape {shape}")
    return shape, stride, off, byte_offset


def _contiguous(shape: list[int]) -> list[int]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return list(reversed(stride))
