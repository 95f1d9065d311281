"""Digests of loop items: how fast-forward proves that consuming a source reproduced the item
the original run handed to the loop body.

``digest(obj, read)`` is an xxh3-128 over the type names, shapes, dtypes and bytes of ``obj``,
walked iteratively: tuples, lists, dicts, objects with a ``__dict__`` or ``__slots__``, scalars,
strings, CPU torch tensors and numpy arrays. It returns ``(hex, None)``, or ``(None, why)`` when
the item cannot be digested (a CUDA tensor, a set, a cycle, more than ``knobs.FF_DIGEST_MAX_BYTES``
of data), in which case nothing is proven.

The writer runs it in the forked child, which must not run torch operators: tensors are read
through their metadata and ``read(address, nbytes)`` (the drain-aware reader: a drained storage
reads as zeros at its own address); numpy is used only to gather strided memory. Replay runs
the same function on the items it reproduced, reading memory in place.
"""

from __future__ import annotations

import struct
import sys
import types
from array import array

import xxhash

from gpusnap import knobs
from gpusnap.rawmem import strided_extent, view_at

MAX_NODES = 100_000
_OPAQUE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
           types.GeneratorType, types.CodeType, types.FrameType)
_NAMED = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)  # ``by_name``


class _Undigestible(Exception):
    pass


def _type_name(obj) -> bytes:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}".encode()


class _Walk:
    def __init__(self, read, max_bytes: int, host_copy=None, by_name: bool = False):
        self.by_name = by_name  # functions, classes and modules count by their names
        self.h = xxhash.xxh3_128()
        self.read = read or view_at
        self.host_copy = host_copy
        self.bytes_left = self.max_bytes = max_bytes
        self.nodes_left = MAX_NODES
        self.torch = sys.modules.get("torch")
        self.np = sys.modules.get("numpy")

    def tag(self, *parts) -> None:
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode("utf-8", "surrogatepass")
            self.h.update(struct.pack("<Q", len(data)))
            self.h.update(data)

    def data(self, view) -> None:
        self.bytes_left -= len(view)
        if self.bytes_left < 0:
            raise _Undigestible(self.too_big())
        self.tag(b"bytes", str(len(view)))
        self.h.update(view)

    def too_big(self) -> str:
        return f"more than {self.max_bytes:,} bytes of data (GPUSNAP_FF_DIGEST_MAX_BYTES)"

    def run(self, obj) -> None:
        stack = [obj]
        while stack:
            x = stack.pop()
            self.nodes_left -= 1
            if self.nodes_left < 0:
                raise _Undigestible(f"more than {MAX_NODES} objects")
            stack.extend(reversed(self.one(x)))

    def one(self, x) -> list:
        """Digest ``x``'s own part; return its children, in order."""
        if x is _UNSET:
            self.tag(b"unset slot")
            return []
        if x is None or isinstance(x, (bool, int, float, complex, str, range)):
            self.tag(_type_name(x), repr(x) if not isinstance(x, float) else struct.pack("<d", x))
            return []
        if isinstance(x, (bytes, bytearray, memoryview)):
            self.tag(_type_name(x))
            self.data(memoryview(x).cast("B"))
            return []
        torch, np = self.torch, self.np
        if torch is not None and isinstance(x, torch.Tensor):
            self.tensor(x)
            return []
        if torch is not None and isinstance(x, (torch.dtype, torch.device)):  # (a batch's description holds them)
            self.tag(_type_name(x), str(x))
            return []
        if np is not None and isinstance(x, np.ndarray):
            self.ndarray(x)
            return []
        if np is not None and isinstance(x, np.generic):
            self.tag(_type_name(x), x.dtype.str)
            self.data(memoryview(x.tobytes()))
            return []
        if isinstance(x, (tuple, list)):
            if len(x) > 16:
                try:
                    ints = array("q", x)  # indices, token ids: one buffer, not a node per number
                except (TypeError, OverflowError):
                    pass
                else:
                    self.tag(_type_name(x), "ints")
                    self.data(memoryview(ints).cast("B"))
                    return []
            self.tag(_type_name(x), len(x))
            return list(x)
        if isinstance(x, dict):
            self.tag(_type_name(x), len(x))
            return [part for pair in x.items() for part in pair]
        if self.by_name and isinstance(x, _NAMED):
            self.tag(_type_name(x), getattr(x, "__module__", None) or "", getattr(x, "__qualname__", None) or getattr(x, "__name__", ""))
            return []
        if isinstance(x, _OPAQUE) or isinstance(x, (set, frozenset)):
            raise _Undigestible(f"a {type(x).__name__}")
        return self.fields(x)

    def fields(self, x) -> list:
        attrs = getattr(x, "__dict__", None)
        names = [n for cls in type(x).__mro__ for n in getattr(cls, "__slots__", ()) if n not in ("__dict__", "__weakref__")]
        if not isinstance(attrs, dict) and not names:
            raise _Undigestible(f"a {type(x).__name__} (no __dict__ or __slots__)")
        children = []
        for name in names:
            children += [name, getattr(x, name, _UNSET)]
        if isinstance(attrs, dict):
            children += [part for pair in attrs.items() for part in pair]
        self.tag(_type_name(x), len(children))
        return children

    def tensor(self, t) -> None:
        torch = self.torch
        if t.device.type != "cpu" and self.host_copy is not None and t.layout == torch.strided:
            t = self.host_copy(t)
        if t.layout != torch.strided or t.is_quantized or t.device.type != "cpu":
            raise _Undigestible(f"a {t.device.type} tensor" if t.device.type != "cpu" else "a non-strided tensor")
        size = t.element_size()
        self.tag(_type_name(t), str(t.dtype), tuple(t.shape), t.is_conj(), t.is_neg())
        if t.numel() == 0:
            return
        if t.is_contiguous():
            self.data(self.read(t.data_ptr(), t.numel() * size))
        else:
            self.strided(t.data_ptr(), size, tuple(t.shape), tuple(s * size for s in t.stride()))

    def ndarray(self, a) -> None:
        if a.dtype.hasobject:
            raise _Undigestible("a numpy array of objects")
        self.tag(_type_name(a), a.dtype.str, a.shape)
        if a.size == 0:
            return
        address = a.__array_interface__["data"][0]
        if a.flags.c_contiguous:
            self.data(self.read(address, a.nbytes))
        else:
            self.strided(address, a.itemsize, a.shape, a.strides)

    def strided(self, address: int, itemsize: int, shape: tuple, strides: tuple) -> None:
        np = self.np
        if np is None:
            raise _Undigestible("a strided tensor (numpy is not loaded)")
        lo, nbytes = strided_extent(address, shape, strides, itemsize)
        if nbytes > self.bytes_left:
            raise _Undigestible(self.too_big())
        span = self.read(lo, nbytes)
        items = np.ndarray(shape, np.dtype((np.void, itemsize)), buffer=span, offset=address - lo, strides=strides)
        self.data(memoryview(np.ascontiguousarray(items)).cast("B"))


_UNSET = object()  # stands for a __slots__ entry that holds nothing


def digest(obj, read=None, max_bytes: int | None = None, host_copy=None, by_name: bool = False) -> tuple[str | None, str | None]:
    """(xxh3-128 hex, None), or (None, why it cannot be digested). ``host_copy(tensor)``: a CPU
    copy of a device tensor (the trainee's witness; the writer cannot run torch operators).
    ``by_name``: functions, classes and modules count by their names (a dataset's transforms),
    where an item's digest cannot be taken over one."""
    walk = _Walk(read, knobs.FF_DIGEST_MAX_BYTES if max_bytes is None else max_bytes, host_copy, by_name)
    try:
        walk.run(obj)
    except _Undigestible as exc:
        return None, str(exc)
    except Exception as exc:  # a property that raises, a buffer numpy cannot read
        return None, f"{type(exc).__name__} while reading it"
    return walk.h.hexdigest(), None


# -- shared by the writer's notes and replay's checks -------------------------------------------
MISSING = object()  # a part of an item, or an object at a path, that is not there
_FINGERPRINT_DEPTH = 8
_ITER_TYPES = (type(iter([])), type(iter(())), type(iter(range(1))), type(iter(range(1 << 64))))


def part_of(item, at: tuple):
    for i in at:
        if not isinstance(item, (tuple, list)) or i >= len(item):
            return MISSING
        item = item[i]
    return item


def loader_iter_class():
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    return getattr(dataloader, "_BaseDataLoaderIter", None)


def _generator_state(x):
    """A random number generator a generator holds (an endless stream's own) counts by its state,
    ``(kind, state)``: its attributes alone do not hold it. Anything else, as it is."""
    from gpusnap.graph import rng

    state = rng.owned_state(x)
    return x if state is None else state


def generator_place(gen) -> str:
    """Where a suspended generator waits, by its function and position: an entered
    ``contextmanager``'s, whose locals the merge writes, is at its place where this matches."""
    return f"{gen.gi_code.co_qualname} {gen.gi_frame.f_lasti}"


def fingerprint(obj, read=None, strict: bool = True) -> str | None:
    """xxh3-128 of a generator's state: its code position and locals, and what it delegates to
    (generators, list/tuple/range iterators), recursively. ``strict``: every local must be
    digested (else None); otherwise only plain data (numbers, strings, lists of them) counts."""
    h = xxhash.xxh3_128()
    stack = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        if depth > _FINGERPRINT_DEPTH:
            return None
        if isinstance(x, _ITER_TYPES):
            _, args, *state = x.__reduce__()
            h.update(repr((type(x).__name__, state)).encode())
            x = args[0]
        if not isinstance(x, types.GeneratorType):
            x = _generator_state(x)
            value, why = (digest(x, read) if strict or _plain(x) else (None, "opaque"))
            if value is None and strict:
                return None
            h.update((value or f"opaque {type(x).__qualname__}").encode())
            continue
        frame = x.gi_frame
        if frame is None:
            h.update(b"finished")
            continue
        h.update(f"{x.gi_code.co_qualname} {frame.f_lasti}".encode())
        for name, value in frame.f_locals.items():
            if name.startswith("__gpusnap_"):
                continue  # an instrumented `while`'s own state (its loop object): its index is the loop's note
            h.update(name.encode())
            stack.append((value, depth + 1))
        if x.gi_yieldfrom is not None:
            stack.append((x.gi_yieldfrom, depth + 1))
    return h.hexdigest()


def _plain(x) -> bool:
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return True
    if isinstance(x, (list, tuple)):
        try:
            array("q", x)  # the common case: indices
            return True
        except (TypeError, OverflowError):
            return len(x) < 1000 and all(_plain(v) for v in x)
    return False
