"""Global random number generator states: read at the safe point, written back on restore.

Only generators of modules the program has imported are touched (importing numpy or torch here
would cost the program seconds and change nothing). numpy ``Generator`` objects are ordinary
objects of the graph and travel with it.
"""

from __future__ import annotations

import random
import sys


def capture() -> dict:
    states: dict = {"random": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        states["numpy"] = np.random.get_state(legacy=False)
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = torch.get_rng_state()
        if torch.cuda.is_initialized():
            states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore(states: dict) -> None:
    random.setstate(states["random"])
    if "numpy" in states:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "torch" in states:
        import torch

        torch.set_rng_state(states["torch"])
        if "torch.cuda" in states:
            _set_cuda_states(torch, states["torch.cuda"])


def _set_cuda_states(torch, saved: list) -> None:
    """Each GPU's generator state onto the GPU the device map gives its ordinal (none where
    this process sees no GPU; the first saved ordinal wins where several map to one)."""
    from gpusnap.graph.devicemap import target

    done = set()
    for ordinal, state in enumerate(saved):
        where = target(f"cuda:{ordinal}")
        if where != "cpu" and where not in done:
            done.add(where)
            torch.cuda.set_rng_state(state, where)


# -- compact states: taken at loop starts and iteration starts, so they must be cheap -------
#
# ``random.getstate()`` costs about 11 us and numpy's ``get_state()`` about 60 us (it builds a
# dict and an array); copying the generators' C state takes about 1 us. The copy reads the
# known layouts (CPython's RandomObject, per interpreter version: ``RANDOM_LAYOUTS``; numpy's
# ``bit_generator.ctypes.state_address``: 624 words and a position; the legacy gaussian cache
# in RandomState), each checked once against the slow getter, which is used where the layout
# is unknown or the check fails. ``compact()`` holds raw bytes and a torch tensor; ``to_json`` (in the writer) encodes
# them, ``restore_json`` puts them back.

import base64
import struct

from gpusnap.rawmem import view_at

_MT_WORDS = 624
_MT_BYTES = 4 + 4 * _MT_WORDS  # CPython: int index, then the words; numpy: the words, then pos
_numpy_layout: tuple | None = None  # (RandomState, view of its state, view of its gauss) or ()

# CPython's random.Random in memory (Modules/_randommodule.c, unchanged from 3.11 to 3.13):
#     typedef struct { PyObject_HEAD  int index;  uint32_t state[624]; } RandomObject;
# On a 64-bit build with the default object header (ob_refcnt and ob_type, 8 bytes each), index
# lies at 16 and the words right after it at 20 (uint32_t is aligned to 4). A free-threaded or
# debug build has a larger header: its object.__basicsize__ tells, and it is refused.
# (major, minor) -> (object header bytes, offset of index, offset of state)
RANDOM_LAYOUTS = {
    (3, 11): (16, 16, 20),
    (3, 12): (16, 16, 20),
    (3, 13): (16, 16, 20),
}
_VERSION = sys.version_info[:2]
_PROBE_SEEDS = (0, 1, 20240917, 2**64 + 3)
_random_read = None  # reads random._inst's state in place; None: not set up yet; False: getstate()
random_refused: str | None = None  # why random's state is read through getstate() (LayoutUnknown)


class LayoutUnknown(Exception):
    """random.Random's memory is not laid out as this gpusnap knows for this interpreter (another
    version or build), or reading it gave other words than ``getstate()``: its memory is not
    read (``_random_raw`` takes ``getstate()``'s copy instead of misreading)."""


def _packed(state: tuple) -> bytes:
    """``getstate()``'s words in RandomObject's order: index, then the 624 words."""
    version, words, _ = state
    if version != 3 or len(words) != _MT_WORDS + 1:
        raise LayoutUnknown(f"random.Random.getstate() gave version {version} with {len(words)} words")
    return struct.pack(f"i{_MT_WORDS}I", words[-1], *words[:-1])


def random_layout() -> tuple[int, int]:
    """(offset of index, offset of the words) in a random.Random on this interpreter, or
    LayoutUnknown."""
    layout = RANDOM_LAYOUTS.get(_VERSION)
    if layout is None:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(RANDOM_LAYOUTS))
        raise LayoutUnknown(f"no known layout of random.Random for CPython {_VERSION[0]}.{_VERSION[1]} (known: {known})")
    header, index_at, state_at = layout
    if object.__basicsize__ != header or struct.calcsize("P") != 8:
        raise LayoutUnknown(f"CPython {_VERSION[0]}.{_VERSION[1]} with a {object.__basicsize__}-byte object header "
                            f"({struct.calcsize('P') * 8}-bit): the known layout is for a {header}-byte one")
    return index_at, state_at


def random_reader(inst: random.Random):
    """A function that returns ``inst``'s state as ``_packed(inst.getstate())`` would, read in
    place; LayoutUnknown where the layout is unknown or fails its check on fresh generators."""
    index_at, state_at = random_layout()

    def reader(obj):  # views made once: a ctypes call costs about 0.6 us, bytes() of a view is a memcpy
        if state_at == index_at + 4:
            whole = view_at(id(obj) + index_at, _MT_BYTES)
            return lambda: bytes(whole)
        index, words = view_at(id(obj) + index_at, 4), view_at(id(obj) + state_at, 4 * _MT_WORDS)
        return lambda: bytes(index) + bytes(words)

    for seed in _PROBE_SEEDS:
        probe = random.Random(seed)
        for draws in (0, 1, 700):  # the index at the end, inside and after a twist
            for _ in range(draws):
                probe.random()
            if reader(probe)() != _packed(probe.getstate()):
                raise LayoutUnknown(f"random.Random({seed}) read at offsets {index_at}/{state_at} on CPython "
                                    f"{_VERSION[0]}.{_VERSION[1]} is not what its getstate() says")
    read = reader(inst)
    if read() != _packed(inst.getstate()):
        raise LayoutUnknown("the program's random.Random read in place is not what its getstate() says")
    return read


def _random_raw() -> bytes:
    global _random_read, random_refused
    if _random_read is None:
        try:
            _random_read = random_reader(random._inst)
        except LayoutUnknown as exc:
            _random_read, random_refused = False, str(exc)
    if _random_read is False:
        return _packed(random._inst.getstate())
    return _random_read()


def _gauss_offset(np) -> int | None:
    """Where RandomState keeps (has_gauss, gauss): found on a private instance with a cached
    gaussian (the global one is not touched), right after the pointer to its own bitgen."""
    cls = type(np.random.mtrand._rand)
    probe = cls(np.random.MT19937(0))
    probe.standard_normal()  # draws two, caches one: has_gauss == 1
    state = probe.get_state(legacy=False)
    base, size = id(probe), cls.__basicsize__
    raw = bytes(view_at(base, size))
    for off in range(object.__basicsize__, size - 24, 8):
        pointer = int.from_bytes(raw[off : off + 8], "little")
        if base <= pointer < base + size:
            has_gauss, gauss = struct.unpack_from("i4xd", raw, off + 8)
            if has_gauss == state["has_gauss"] == 1 and gauss == state["gauss"]:
                return off + 8
    return None


def _numpy_raw(mtrand) -> bytes:
    global _numpy_layout
    rs = mtrand._rand
    np = sys.modules["numpy"]
    if _numpy_layout is None or (_numpy_layout and _numpy_layout[0] is not rs):
        _numpy_layout = ()
        try:
            address = rs._bit_generator.ctypes.state_address
            gauss = _gauss_offset(np)
        except Exception:  # another bit generator, a numpy without these: the slow path
            address = gauss = None
        if address is not None and gauss is not None:
            _numpy_layout = (rs, view_at(address, _MT_BYTES), view_at(id(rs) + gauss, 16))
            if _numpy_slow(rs) != _numpy_fast(_numpy_layout):
                _numpy_layout = ()
    return _numpy_fast(_numpy_layout) if _numpy_layout else _numpy_slow(rs)


def _numpy_fast(layout) -> bytes:
    _, words, gauss = layout
    return bytes(words) + bytes(gauss)


def _numpy_slow(rs) -> bytes:
    state = rs.get_state(legacy=False)
    words = state["state"]["key"].astype("<u4").tobytes()
    return words + struct.pack("i", state["state"]["pos"]) + struct.pack("i4xd", state["has_gauss"], state["gauss"])


def compact() -> tuple:
    """The global RNG states, raw: (random, random's gauss_next, numpy or None, torch or None,
    [torch.cuda states] or None)."""
    # numpy loads numpy.random on first use: before that its global generator cannot matter.
    mtrand = sys.modules.get("numpy.random.mtrand")
    torch = sys.modules.get("torch")
    cuda = None
    if torch is not None and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return (
        _random_raw(),
        random._inst.gauss_next,
        _numpy_raw(mtrand) if mtrand is not None else None,
        torch.default_generator.get_state() if torch is not None else None,
        cuda,
    )


def _tensor_bytes(tensor, read=None) -> bytes:
    if read is None:
        return tensor.numpy().tobytes()
    return bytes(read(tensor.data_ptr(), tensor.numel() * tensor.element_size()))


def to_json(raw, read=None) -> dict | None:
    """JSON form of ``compact()``; ``read(address, nbytes)`` reads tensor memory (the writer's
    drain-aware reader; without it the tensor is read in place). A dict passes through."""
    if raw is None or isinstance(raw, dict):
        return raw
    rand, gauss_next, np_state, torch_state, cuda = raw
    out = {"random": _b64(rand), "random_gauss": gauss_next}
    if np_state is not None:
        out["numpy"] = _b64(np_state)
    if torch_state is not None:
        out["torch"] = _b64(_tensor_bytes(torch_state, read))
    if cuda is not None:
        out["torch.cuda"] = [_b64(_tensor_bytes(t, read)) for t in cuda]
    return out


def tensor_json(tensor, read=None) -> str:
    """A torch generator state (a uint8 tensor) in base64; ``read`` as for ``to_json``."""
    return _b64(_tensor_bytes(tensor, read))


def tensor_b64(text: str):
    """A torch generator state (a uint8 tensor) from its base64 form."""
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def from_json(states: dict) -> tuple:
    """Back to the raw form (to compare with ``compact()``)."""
    torch = sys.modules.get("torch")
    tensor = tensor_b64
    return (
        base64.b64decode(states["random"]),
        states.get("random_gauss"),
        base64.b64decode(states["numpy"]) if "numpy" in states else None,
        tensor(states["torch"]) if "torch" in states and torch is not None else None,
        [tensor(t) for t in states["torch.cuda"]] if "torch.cuda" in states and torch is not None else None,
    )


def restore_json(states: dict) -> None:
    words = struct.unpack_from(f"i{_MT_WORDS}I", base64.b64decode(states["random"]))
    random.setstate((3, (*words[1:], words[0]), states.get("random_gauss")))
    if "numpy" in states:
        import numpy as np

        raw = base64.b64decode(states["numpy"])
        key = np.frombuffer(raw[: 4 * _MT_WORDS], dtype="<u4").astype(np.uint32)
        (pos,) = struct.unpack_from("i", raw, 4 * _MT_WORDS)
        has_gauss, gauss = struct.unpack_from("i4xd", raw, _MT_BYTES)
        np.random.set_state(
            {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}, "has_gauss": has_gauss, "gauss": gauss}
        )
    if "torch" in states:
        import torch

        _, _, _, torch_state, cuda = from_json(states)
        torch.set_rng_state(torch_state)
        if cuda is not None:
            _set_cuda_states(torch, cuda)


def same(a: tuple, b: tuple) -> bool:
    """Two ``compact()`` states are equal (outside the writer: reads tensors in place)."""
    if a[:3] != b[:3]:
        return False
    for x, y in ((a[3], b[3]), *zip(a[4] or (), b[4] or ())):
        if (x is None) != (y is None) or (x is not None and _tensor_bytes(x) != _tensor_bytes(y)):
            return False
    return (a[4] is None) == (b[4] is None)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- generators the program owns ---------------------------------------------------------------
#
# A data source that draws from a generator of its own (``def batches(rng): ... rng.normal()``)
# is consumed by fast-forward from that generator as replay left it: at its seeded start, not
# where the original loop found it after earlier epochs. Fast-forward notes the states of the
# generators a source holds when its loop starts, and gives them back before consuming.

_MAX_HOLDERS = 64  # a source's locals or attributes looked at; beyond, nothing is noted


def owned_state(obj):
    """The raw state of a program-owned ``random.Random``, numpy ``Generator`` or
    ``RandomState``, or ``torch.Generator``; None for anything else."""
    if isinstance(obj, random.Random):
        return ("random", obj.getstate()) if type(obj).getstate is random.Random.getstate else None
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(obj, np.random.Generator):
            return ("numpy.Generator", obj.bit_generator.state)
        if isinstance(obj, np.random.RandomState):
            return ("numpy.RandomState", obj.get_state(legacy=False))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Generator):
        return ("torch.Generator", obj.get_state())
    return None


def owned_states(holders: dict) -> dict:
    """``{name: raw state}`` of the generators among ``holders`` (a frame's locals, an object's
    attributes)."""
    if len(holders) > _MAX_HOLDERS:
        return {}
    found = {}
    for name, value in holders.items():
        state = owned_state(value)
        if state is not None:
            found[name] = state
    return found


def owned_json(raw: tuple, read=None) -> dict:
    kind, state = raw
    if kind == "torch.Generator":
        return {"kind": kind, "state": _b64(_tensor_bytes(state, read))}
    return {"kind": kind, "state": _plain_json(state)}


def restore_owned_raw(obj, raw: tuple) -> None:
    """Put ``obj`` back to ``owned_state``'s ``(kind, state)``."""
    kind, state = raw
    if kind == "random":
        obj.setstate(state)
    elif kind == "numpy.Generator":
        obj.bit_generator.state = state
    else:  # numpy.RandomState, torch.Generator
        obj.set_state(state)


def restore_owned(obj, saved: dict) -> bool:
    """Put ``obj`` back to a state ``owned_json`` wrote; False when ``obj`` is not a generator
    of that kind."""
    current = owned_state(obj)
    if current is None or current[0] != saved.get("kind"):
        return False
    kind, state = saved["kind"], _from_plain_json(saved["state"])
    if kind == "random":
        version, words, gauss = state
        state = (version, tuple(words), gauss)
    elif kind == "torch.Generator":
        state = tensor_b64(state)
    restore_owned_raw(obj, (kind, state))
    return True


def _plain_json(value):
    """numpy generator states hold arrays: as ``{"ndarray": dtype, "b64": bytes}``."""
    if isinstance(value, dict):
        return {key: _plain_json(v) for key, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain_json(v) for v in value]
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return {"ndarray": value.dtype.str, "b64": _b64(value.tobytes())}
    if np is not None and isinstance(value, np.generic):
        return value.item()
    return value


def _from_plain_json(value):
    if isinstance(value, dict):
        if set(value) == {"ndarray", "b64"}:
            import numpy as np

            return np.frombuffer(base64.b64decode(value["b64"]), dtype=value["ndarray"]).copy()
        return {key: _from_plain_json(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_from_plain_json(v) for v in value]
    return value
