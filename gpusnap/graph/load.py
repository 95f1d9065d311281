"""What a snapshot's pickle stream calls while it loads, and ``load_graph``.

The graph pickler (``capture.pickling.pickler``) names these functions in the stream, so they live here,
importable by both sides: restore must never import capture. Placeholders:

- ``LiveOnly`` stands where the snapshot held an object it does not capture (a file, a
  DataLoader iterator, a module): restore keeps the object the replayed program built there;
- ``LiveFunction``, a ``LiveOnly`` for a local function (a closure): restore keeps the replayed
  function, and merges what the snapshot's cells held into its cells;
- ``LiveClass``, a ``LiveOnly`` for a class of the program's defined inside a function:
  restore keeps the replayed class, and sets the snapshot's class attributes on it;
- ``LiveObject``, a ``LiveOnly`` for an instance of a class that cannot be found by name (one
  defined inside a function, or made at run time): restore keeps the replayed object and merges
  the snapshot's attributes into it (those of the classes torch makes one per object, a
  parametrized module's and a torch.fx GraphModule's, are made again: ``graph.madeclasses``);
- ``LiveFile``, a ``LiveOnly`` for a file the program writes through (``open()``'s): where the
  replay made none at its place (it was opened after setup), restore opens its path again;
- ``LiveMemmap``, a ``LiveFile`` for a NumPy memmap (read-only, or written in place): mapped again;
- ``LiveOverFile``, a ``LiveOnly`` for an object that writes through a file (a ``csv.writer``):
  where the replay made none at its place, restore makes it again over its file;
- ``Unbuilt`` stands where an object was captured but cannot be rebuilt in this process (its
  constructor refused an argument that is itself live-only, such as a ``functools.partial`` of a
  local function): restore keeps the replayed object there, and refuses if there is none;
- a ``weakref.WeakKeyDictionary``, ``WeakValueDictionary`` or ``WeakSet`` is pickled by its
  items (``_weak_mapping``, ``_weak_set``), and merged by them into the replay's;
- a ``logging.Handler`` is ``_log_handler(class, state)``: made again around its state, its
  file reopened at the next record;
- ``HookHandle`` stands where the snapshot held a torch hook handle (``RemovableHandle``): the
  dict of hooks it removes from, held strongly, and its id there; the merge points the
  replay's handle at the live dict;
- ``CoreBuffer`` stands where the snapshot held a cuda.core Buffer: its bytes on the host, which
  the merge copies into the replayed program's Buffer at that place, or into one it makes;
- ``Unkept`` stands where the snapshot met state it cannot hold and a restart must not go on
  without (what a native library holds: an SQLite connection's changes not yet committed): the
  merge refuses, saying why.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import sys
import threading
import weakref

from gpusnap import moved
from gpusnap.rawmem import view_at

# {saved allocation seq: its base in this process}: set by the restore before the graph loads
# (raw allocations matched by call site, stage.device.restore_allocations).
DEVICE_BASES: dict[int, int] = {}


def _device_pointer(seq: int, offset: int):
    """A ``CUdeviceptr`` into raw allocation ``seq``, at that allocation's base in this process."""
    from cuda.bindings.driver import CUdeviceptr

    base = DEVICE_BASES.get(seq)
    if base is None:
        raise pickle.UnpicklingError(f"a CUdeviceptr points into raw allocation #{seq}, which was not restored")
    return CUdeviceptr(base + offset)


def _raw_ndarray(seq: int, offset: int, dtype: str, shape, strides):
    """A numpy view of raw allocation ``seq`` (managed memory), at its base in this process."""
    import numpy as np

    base = DEVICE_BASES.get(seq)
    if base is None:
        raise pickle.UnpicklingError(f"a numpy array views raw allocation #{seq}, which was not restored")
    span = sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + np.dtype(dtype).itemsize if all(shape) else 0
    memory = view_at(base + offset, span)
    return np.ndarray(shape, np.dtype(dtype), buffer=memory, strides=strides)


class NotCaptured(AttributeError):
    """The program used a ``LiveOnly`` placeholder: an object the snapshot could not hold, at a
    place where the replayed program made none (inside an object made after setup). An
    AttributeError, so that a probe (``getattr(x, name, default)``, ``hasattr``) reads it as a
    miss; restore blames the restore for it, never the program (``replay``)."""


class LiveOnly:
    """Stands where the snapshot held an object it could not capture. Where the replayed program
    has none to keep (inside an object made after setup: the merge says ``where``), the program
    may reach the placeholder itself: an attribute of it, or ``with`` on it, raises ``NotCaptured``,
    naming the object. It stays neither callable nor iterable: a constructor that checks its
    argument (``functools.partial``) must still refuse it (``Unbuilt``)."""

    __slots__ = ("serial", "type_name", "where")

    def __init__(self, serial: int, type_name: str):
        self.serial, self.type_name, self.where = serial, type_name, None

    def __repr__(self) -> str:
        return f"<live-only {self.type_name}>"

    def _used(self, how: str):
        at = f" at {self.where}" if self.where else ""
        raise NotCaptured(f"{how} the {self.type_name}{at}, which the snapshot could not hold and the replay did not "
                          "make again (it was made after setup)")

    def __getattr__(self, name: str):  # only for names the placeholder lacks
        if name in LiveOnly.__slots__:
            return None  # a placeholder pickled before it had this slot (a program that held one)
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocol probes (copy, pickle, numpy) stay plain misses
        self._used(f"{name!r} of")

    def __enter__(self):
        self._used("`with` on")

    def __exit__(self, *exc_info):  # never reached, ``__enter__`` raises: ``with`` wants both to exist
        return False


class Unbuilt:
    """Stands where an object's reconstruction failed. Keeps what pickle applies to it next (its
    state, list items, dict entries): the merge puts them into the replayed object where it
    knows how (a ``functools.partial``, a ``defaultdict``) and refuses where it does not.
    ``func`` and ``args``: the reconstruction that failed (where the replay made no such object,
    the merge builds a ``partial`` or ``defaultdict`` again over its function made again)."""

    __slots__ = ("type_name", "error", "state", "items", "entries", "func", "args")

    def __init__(self, type_name: str, error: str, func=None, args=()):
        self.type_name, self.error, self.func, self.args = type_name, error, func, args
        self.state, self.items, self.entries = None, [], {}

    def __repr__(self) -> str:
        return f"<unbuilt {self.type_name}: {self.error}>"

    # pickle's BUILD / APPENDS / SETITEMS on the object that could not be made
    def __setstate__(self, state) -> None:
        self.state = state

    def append(self, item) -> None:
        self.items.append(item)

    def extend(self, items) -> None:
        self.items.extend(items)

    def __setitem__(self, key, value) -> None:
        self.entries[key] = value

    def holds_anything(self) -> bool:
        return self.state is not None or bool(self.items) or bool(self.entries)


class HookHandle:
    """A torch hook handle of the snapshot (``torch.utils.hooks.RemovableHandle``: what
    ``register_forward_hook`` and the others return). Torch's own state holds the dict of hooks
    by a weak reference, which the load pointed at the snapshot's copy of that dict: the handle of
    a warmup's hook registered in setup removed nothing after a restart, and the hook went on
    (``tests/programs/corpus/late_hooks.py remove_hook``). ``hooks``: that dict (None where it
    was gone); ``extra``: the other dicts the handle removes its id from."""

    __slots__ = ("hooks", "id", "extra")

    def __init__(self, hooks, id, extra):
        self.hooks, self.id, self.extra = hooks, id, extra

    def __repr__(self) -> str:
        return f"<hook handle {self.id}>"


# In-memory files: pickled by their own reduction (contents, position), and merged in place;
# every other file is live-only.
MEMORY_FILES = (io.BytesIO, io.StringIO)


def _hook_handle(hooks, id, extra):
    return HookHandle(hooks, id, extra)


# Mappings keyed (or valued) by weak references, and weak sets, which no snapshot holds as such:
# pickled by their items, each held strongly in the stream (an entry whose key nothing else holds
# goes at the load's next collection, as it would have in the run), and merged by them.
WEAK_MAPPINGS = (weakref.WeakKeyDictionary, weakref.WeakValueDictionary)


def _weak_mapping(kind, items):
    mapping = kind()
    mapping.update(items)
    return mapping


def _weak_set(items):
    return weakref.WeakSet(items)


def _log_handler(cls, state):
    """A ``logging.Handler`` of the snapshot, with a lock of its own. A ``FileHandler``'s file is
    opened again at its next record, to append (the restart put the file back as it was); a
    ``StreamHandler`` on the standard streams writes to this process's (``state["stream"]``:
    their name)."""
    handler = cls.__new__(cls)
    vars(handler).update(state)
    handler.createLock()
    if state.get("stream") in ("stdout", "stderr"):
        handler.stream = getattr(sys, state["stream"])
    return handler


class Unkept:
    """State the snapshot could not hold, where the replay's object would stand in for it with
    other state: what a native library holds in its own memory (``frameworks/writers.py``: an
    SQLite connection's rows not yet committed, an open Parquet writer's footer, a compressor's
    state). ``why`` and ``hint`` are the refusal's."""

    __slots__ = ("type_name", "why", "hint")

    def __init__(self, type_name: str, why: str, hint: str):
        self.type_name, self.why, self.hint = type_name, why, hint

    def __repr__(self) -> str:
        return f"<unkept {self.type_name}: {self.why}>"


def _unkept(type_name, why, hint):
    return Unkept(type_name, why, hint)


class ShardedState:
    """A DTensor of the snapshot: this rank's local shard (a plain tensor) and how the shards
    make the whole. The merge copies the shard into the replay's DTensor, or builds one on a
    device mesh the replay has, of the same ``layout``."""

    __slots__ = ("local", "layout", "placements", "shape", "stride", "requires_grad", "is_param", "grad")

    def __init__(self, local, layout, placements, shape, stride, requires_grad, is_param, grad):
        self.local, self.layout, self.placements = local, layout, placements
        self.shape, self.stride, self.requires_grad, self.is_param, self.grad = shape, stride, requires_grad, is_param, grad

    def __repr__(self) -> str:
        return f"<sharded {self.shape} of {self.layout}>"


def dtensor_layout(t) -> tuple:
    """How a DTensor's shards make the whole: (device type, the mesh's ranks, its dimension
    names, the placements), comparable between the snapshot and the replay."""
    spec = t._spec
    mesh = spec.mesh
    return (mesh.device_type, str(mesh.mesh.tolist()), mesh.mesh_dim_names, tuple(repr(p) for p in spec.placements))


def _sharded_tensor(*fields):
    return ShardedState(*fields)


class CoreBuffer:
    """A cuda.core Buffer of the snapshot: ``data``, a view of its bytes; ``device``, the ordinal
    it was on (-1: host memory); ``kind``, "device", "managed", "pinned" or "host" ("closed" and
    "empty" hold no bytes); ``nbytes``, its size (``restore.corebuffers``)."""

    __slots__ = ("data", "device", "kind", "nbytes")

    def __init__(self, data, device: int, kind: str, nbytes: int):
        self.data, self.device, self.kind, self.nbytes = data, device, kind, nbytes

    @property
    def host(self) -> bool:
        """Host memory (pinned, or the program's own pages): written by the CPU on restore."""
        return self.kind in ("pinned", "host")

    def __repr__(self) -> str:
        return f"<cuda.core {self.kind} Buffer of {self.nbytes} bytes>"


def _core_buffer(name, offset, nbytes, device, kind):
    """A cuda.core Buffer: ``nbytes`` at ``offset`` of buffer ``name`` (None: no bytes)."""
    data = b""
    if name is not None:
        data = _buffer_view(name)[offset : offset + nbytes]
        if len(data) != nbytes:
            raise pickle.UnpicklingError(f"a cuda.core Buffer of {nbytes} bytes at {offset} lies outside buffer {name}")
    return CoreBuffer(data, device, kind, nbytes)


class LiveFunction(LiveOnly):
    """Stands where the snapshot held a local function: the function is the replay's, but its
    closure cells hold state the program goes on with (an optimizer a factory made and only a
    ``train_step`` closure refers to). ``cells``: {free variable name: what the cell held};
    ``line``: its code's first line (None in snapshots made before it was kept); ``made``:
    what makes it again where the replay made none (``capture.pickling.pickler``'s
    ``_live_function``: "module", "frames", "cell_ids", "modules", "defaults", "kwdefaults",
    "attrs", "names"; empty in snapshots made before it was kept)."""

    __slots__ = ("qualname", "cells", "line", "made")

    def __init__(self, serial: int, type_name: str):
        super().__init__(serial, type_name)
        self.qualname, self.cells, self.line, self.made = "", {}, None, {}

    def __setstate__(self, state) -> None:  # after the placeholder is memoized: cells may hold it
        self.qualname, self.cells = state[:2]
        self.line = state[2] if len(state) > 2 else None
        self.made = state[3] if len(state) > 3 else {}


class LiveClass(LiveOnly):
    """Stands where the snapshot held a class of the program's that cannot be found by name (one
    defined inside a function): the class is the replay's, its attributes the snapshot's
    (``graph.roots.class_state``: a count the loop keeps on it)."""

    __slots__ = ("qualname", "attrs")

    def __init__(self, serial: int, type_name: str):
        super().__init__(serial, type_name)
        self.qualname, self.attrs = "", {}

    def __setstate__(self, state) -> None:
        self.qualname, self.attrs = state


class LiveObject(LiveOnly):
    """Stands where the snapshot held an instance of a class that cannot be found by name: the
    object is the replay's, its state the snapshot's. ``attrs``: its ``__dict__``; ``slots``:
    its slot values; ``made``: what makes it again of the replay's class where the replay has
    none to merge into, or one it cannot merge into (a tuple, an Enum member): ``cls`` (the
    class's placeholder), ``items`` (a tuple's), ``member`` (an Enum member's name)."""

    __slots__ = ("qualname", "attrs", "slots", "made")

    def __init__(self, serial: int, type_name: str):
        super().__init__(serial, type_name)
        self.qualname, self.attrs, self.slots, self.made = "", {}, {}, {}

    def __setstate__(self, state) -> None:  # after the placeholder is memoized: attributes may hold it
        self.qualname, self.attrs, self.slots, self.made = (*state, {})[:4]


class LiveFile(LiveOnly):
    """Stands where the snapshot held a plain Python file the program writes through, made after
    setup (a CSV logger's, opened at its first record): the replay's file where it made one at
    this place, as for any ``LiveOnly``; where it made none, the same path opened again
    (``open_again``), which the restart has put back as it was at the snapshot. ``state``:
    ``files.disk.reopen_state``'s."""

    __slots__ = ("state",)

    def __init__(self, serial: int, type_name: str, state: dict):
        super().__init__(serial, type_name)
        self.state = state

    @property
    def path(self) -> str:
        """The file's path here: the run's, under where the program's files are on this machine
        where they moved (``gpusnap.moved``)."""
        return moved.here(self.state["path"])

    def elsewhere(self, live) -> bool:
        """Whether ``live``, the replay's file at this place, is another file than the run's: the
        replayed setup named it from what the run had left on disk (``runs/exp2``, ``runs/exp``
        taken), or from the clock or its process id."""
        try:
            here = os.readlink(f"/proc/self/fd/{live.fileno()}")
        except (AttributeError, OSError, ValueError, TypeError):
            return False
        return here.startswith("/") and here != self.path

    def open_again(self):
        """The file opened again to go on where it stood: appending where it appended, else
        written in place (never truncated: ``w`` becomes ``r+``) from its offset at the snapshot.
        (A text file's ``newline`` is not known to Python: it writes ``\n`` as the default does.)"""
        s = self.state
        mode = ("a+" if "+" in s["mode"] else "a") if "a" in s["mode"] else "r+"
        if s["text"]:
            f = open(self.path, mode, buffering=1 if s["line_buffering"] else -1, encoding=s["encoding"], errors=s["errors"])
            if s["write_through"]:
                f.reconfigure(write_through=True)
        else:
            f = open(self.path, mode + "b")
        if "a" not in mode:
            f.seek(s["offset"])
        return f


class LiveMemmap(LiveFile):
    """A ``LiveFile`` for a NumPy memmap over the whole mapping it made (``np.memmap``,
    ``np.lib.format.open_memmap``): the file mapped again, read-only where it was, else to write
    (``r+``, never truncated). Pickled by value it was an array over no file, which a step's
    writes and ``flush()`` never reached. ``state``: path, dtype, offset, shape, order, mode."""

    __slots__ = ()

    def open_again(self):
        import numpy as np

        s = self.state
        return np.memmap(self.path, dtype=s["dtype"], mode="r" if s["mode"] == "r" else "r+", offset=s["offset"],
                         shape=s["shape"], order=s["order"])


class LiveOverFile(LiveOnly):
    """Stands where the snapshot held an object that writes through a file it holds where Python
    cannot reach it (a ``csv.writer``, made at a logger's first record): the replay's object where
    it made one at this place; where it made none, ``build(file, **params)`` over the live
    counterpart of the file (the replay's, or the file opened again: ``LiveFile``)."""

    __slots__ = ("file", "build", "params")

    def __init__(self, serial: int, type_name: str):
        super().__init__(serial, type_name)
        self.file, self.build, self.params = None, None, {}

    def __setstate__(self, state) -> None:  # after the placeholder is memoized
        self.file, self.build, self.params = state


class LiveGenerator(LiveOnly):
    """Stands where the snapshot held a suspended generator of instrumented code: the generator
    is the replay's, run to the same place (``restore.livecheck``), its locals the snapshot's."""

    __slots__ = ("qualname", "locals")

    def __init__(self, serial: int, type_name: str):
        super().__init__(serial, type_name)
        self.qualname, self.locals = "", {}

    def __setstate__(self, state) -> None:
        self.qualname, self.locals = state


class LiveBuiltinMethod(LiveOnly):
    """A builtin method bound to an object (`record = losses.append`, `draw = rng.random`,
    `write = log.write`, `new_id = ids.__next__`): live-only, with its owner (in the graph as any
    object, a file as ``LiveFile``) and its name, so that the merge binds it to the owner's live
    counterpart, not to whatever the replay bound there."""

    __slots__ = ("owner", "name")

    def __init__(self, serial: int, type_name: str, owner=None, name: str = ""):
        super().__init__(serial, type_name)
        self.owner, self.name = owner, name


_loading = threading.local()


def _live_only(serial, name):
    return LiveOnly(serial, name)


def _live_builtin_method(serial, name, owner, method):
    return LiveBuiltinMethod(serial, name, owner, method)


def _live_file(serial, name, state):
    return LiveFile(serial, name, state)


def _live_memmap(serial, name, state):
    return LiveMemmap(serial, name, state)


def _live_over_file(serial, name):
    return LiveOverFile(serial, name)


def _live_function(serial, name):
    return LiveFunction(serial, name)


def _live_class(serial, name):
    return LiveClass(serial, name)


def _live_object(serial, name):
    return LiveObject(serial, name)


def _live_generator(serial, name):
    return LiveGenerator(serial, name)


def _with_run_id(run_id, func, args):
    """``func(*args)``, noted in ``RUN_IDS`` as the object whose id in the run was ``run_id``
    (a module's: the ints a program kept of it are merged as the live module's id)."""
    obj = func(*args)
    if not isinstance(obj, Unbuilt):
        RUN_IDS[run_id] = obj
    return obj


def _construct(func, args, type_name):
    """``func(*args)``, or an ``Unbuilt`` placeholder when the call fails (see module doc)."""
    try:
        return func(*args)
    except Exception as exc:  # noqa: BLE001 - any failure: the merge decides what it means
        return Unbuilt(type_name, f"{type(exc).__name__}: {exc}", func, args)


def findable(obj) -> bool:
    """True when pickle can save ``obj`` (a function, a class, a cached function) by reference to
    its name: the name it was defined under finds it."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    qualname = getattr(obj, "__qualname__", None)
    if module is None or not qualname or "<" in qualname:
        return False
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return False
    return found is obj


def _module_attribute(module, name):
    """``module.name`` in this process (``random.randint``: a method of the module's own
    generator, which restore must not replace by a copy)."""
    return getattr(importlib.import_module(module), name)


def _bound_method(func, owner):
    """A function bound to an object by hand (``types.MethodType(noisy_forward, model)``), which
    its owner's class has no method of that name to get it by."""
    import types

    return types.MethodType(func, owner)


def _set_state(obj, state):
    """pickle's BUILD without looking ``__setstate__`` up on the instance: a class whose
    ``__getattr__`` reads its own attributes (a wrapper that forwards to ``self._wrapped``)
    would recurse forever on the half-built object."""
    if isinstance(obj, Unbuilt):
        obj.__setstate__(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        object.__getattribute__(obj, "__dict__").update(state)
    for name, value in (slots or {}).items():
        object.__setattr__(obj, name, value)


# id(loaded object) -> names of the attributes its class's ``__setstate__`` added beyond the
# saved state, for the objects of the last ``load_graph`` (merge reads it; see _set_state_by_class).
ADDED_BY_SETSTATE: dict[int, frozenset] = {}
# id(tensor or module) in the process that took the snapshot -> the object loaded for it, for the
# objects of the last ``load_graph``: an int the program kept that equals one is that object's id
# (a dict `{id(p): name}`), and the merge gives it the id of the live object that stands for it
# (restore.merge). Addresses of live objects, 16-byte aligned and above 2**32: no count or index
# the program keeps is one.
RUN_IDS: dict[int, object] = {}
# id(loaded tensor) -> the gradient hooks the run's tensor had (``register_hook``,
# ``register_post_accumulate_grad_hook``): ``grad_hook_dicts``' pair, or, in a stream written
# before the hooks were kept, how many; for the objects of the last ``load_graph``; absent for a
# stream written before they were counted.
GRAD_HOOKS: dict[int, tuple | int] = {}


def grad_hooks(t) -> int:
    """How many gradient hooks ``t`` has (its ``register_hook``s and post-accumulate hooks)."""
    return len(t._backward_hooks or ()) + len(getattr(t, "_post_accumulate_grad_hooks", None) or ())


def grad_hook_dicts(t) -> tuple | None:
    """``t``'s dicts of gradient hooks {handle id: hook}, (``_backward_hooks``,
    ``_post_accumulate_grad_hooks``), each None where empty; None where it has none."""
    dicts = (t._backward_hooks or None, getattr(t, "_post_accumulate_grad_hooks", None) or None)
    return dicts if any(dicts) else None


def _set_state_by_class(obj, state):
    """pickle's BUILD for a class with its own ``__setstate__``, noting what that method added
    besides the saved state: DistributedDataParallel's builds a new reducer, logger and process
    group reference for the copy, which must not replace the live object's own (merge).

    A ``__setstate__`` that reads objects its state reaches can meet one that pickle has made but
    not yet built, on a reference cycle: Lightning's module, wrapped in DDP under a distributed
    strategy, holds the trainer that holds that DDP, whose ``__setstate__`` walks the module's
    parameters. Where it fails so (AttributeError), it runs again once the whole graph is built."""
    deferred = getattr(_loading, "deferred", None)
    try:
        obj.__setstate__(state)
    except AttributeError:
        if deferred is None:
            raise
        deferred.append((obj, state))
        return
    _note_added(obj, state)


def _note_added(obj, state) -> None:
    saved = state[0] if isinstance(state, tuple) and len(state) == 2 else state
    attrs = getattr(obj, "__dict__", None)
    if isinstance(saved, dict) and isinstance(attrs, dict):
        added = frozenset(name for name in attrs if name not in saved)
        if added:
            ADDED_BY_SETSTATE[id(obj)] = added


def _load_storage(name, device):
    cache = _loading.storages
    storage = cache.get(name)
    if storage is None:
        import torch

        data = _loading.read_buffer(name)
        if len(data) == 0:
            storage = torch.UntypedStorage(0)
        else:
            storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
        cache[name] = storage
    return storage


def _meta_storage(nbytes):
    """A storage on the meta device: its size, which has no bytes."""
    import torch

    return torch.UntypedStorage(nbytes, device="meta")


def _load_device_storage(name, offset, nbytes, device):
    """A device storage (saved on ``device``, e.g. "cuda:1"), loaded as a CPU storage over its
    bytes in buffer ``name`` at ``offset``. The merge copies it into the live tensor, wherever
    the replay put that; a tensor the replay does not hold is placed afterwards
    (``load_graph``'s ``device_tensors``, ``restore.devices``): loading onto the GPU first would
    need the program's GPU memory twice."""
    cache = _loading.storages
    storage = cache.get((name, offset, nbytes))
    if storage is None:
        import torch

        data = _buffer_view(name)
        if offset + nbytes > len(data):
            raise pickle.UnpicklingError(f"a {device} storage of {nbytes} bytes at {offset} lies outside buffer {name}")
        storage = torch.frombuffer(data[offset : offset + nbytes], dtype=torch.uint8).untyped_storage()
        cache[(name, offset, nbytes)] = storage
        _loading.device_storages[id(storage)] = device
    return storage


def _rebuild_tensor(storage, offset, size, stride, dtype, requires_grad, grad, is_param, attrs, run_id=None, hooks=None):
    import torch

    t = torch.empty(0, dtype=getattr(torch, dtype), device=storage.device)
    t.set_(storage, offset, size, stride)
    if is_param:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if grad is not None:
        t.grad = grad
    if attrs:
        t.__dict__.update(attrs)
    if run_id is not None:  # (a stream that has it has the tensor's gradient hooks too)
        RUN_IDS[run_id] = t
        GRAD_HOOKS[id(t)] = hooks or 0
    saved_on = _loading.device_storages.get(id(storage))
    if saved_on is not None:  # the object the graph holds: a Parameter is a tensor of its own
        _loading.device_tensors.append((t, saved_on))
    return t


def _inline_array(kind, dtype, shape, data: bytes):
    """An array a reduction made in the writer (a generator's state), from its bytes: a NumPy
    array, or a torch tensor where ``kind`` is "torch"."""
    import numpy as np

    array = np.frombuffer(bytearray(data), dtype=np.dtype(dtype)).reshape(shape)
    if kind != "torch":
        return array
    import torch

    return torch.from_numpy(array)


def _rebuild_cupy(name, offset, nbytes, dtype, shape, strides, device, start=0):
    """A CuPy array saved on ``device``: on the GPU the map gives when CuPy and a GPU are here
    (``graph.devicemap``), else a NumPy array with the same bytes. The merge copies it into the
    live array; views of one array come back as separate arrays where the replay has none."""
    import numpy as np

    if name is None:
        host = np.empty(shape, np.dtype(dtype))
    else:
        host = _strided(np.frombuffer(_buffer_view(name)[offset : offset + nbytes], np.uint8), start, dtype, shape, strides)
    try:
        import cupy
    except ImportError:
        return host
    from gpusnap.graph.devicemap import target

    where = target(device)
    if where == "cpu":
        return host
    with cupy.cuda.Device(int(where.partition(":")[2] or 0)):
        return cupy.asarray(np.ascontiguousarray(host))


def _buffer_view(name: str) -> memoryview:
    """Buffer ``name``'s bytes, read once per load: device ranges hold many objects' bytes."""
    data = _loading.storages.get(name)
    if data is None:
        data = _loading.storages[name] = memoryview(_loading.read_buffer(name))
    return data


def _strided(span, start: int, dtype: str, shape, strides):
    """The array of ``shape`` and byte ``strides`` whose first element is at ``start`` in ``span``."""
    import numpy as np

    dt = np.dtype(dtype)
    return np.ndarray(shape, dt, buffer=span, offset=start, strides=strides).copy()


def flat_bytes(owner):
    """The memory of ``owner`` (a NumPy array, a tensor or an untyped storage) as a flat uint8
    NumPy array over it, no copy. Torch is imported for a tensor's or a storage's memory only:
    a program may have none."""
    import numpy as np

    if isinstance(owner, np.ndarray):
        return np.ndarray((owner.nbytes,), np.uint8, buffer=owner)
    import torch

    storage = owner.untyped_storage() if isinstance(owner, torch.Tensor) else owner
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def array_base(arr) -> tuple[object, object]:
    """(the last NumPy array of ``arr``'s ``base`` chain, None where it views none; what lies
    under that chain: the tensor of ``t.numpy()``, another owner of memory, or None)."""
    import numpy as np

    root, base = None, arr.base
    while isinstance(base, np.ndarray):
        root, base = base, base.base
    return root, base


def _ndarray_over(owner, offset: int, dtype: str, shape, strides):
    """A NumPy array over the memory of ``owner`` (a tensor, an untyped storage or another
    array), ``offset`` bytes into it: what ``t.numpy()`` or a view of an array was in the run,
    or an array whose ``torch.from_numpy`` tensor was pickled first, sharing that memory as it
    did. Where the replay holds none, the merge builds it again over the live storage that
    stands for a tensor's, or the live array (``restore.kinds``)."""
    import numpy as np

    return np.ndarray(shape, np.dtype(dtype), buffer=flat_bytes(owner), offset=offset, strides=strides)


def _storage_of_ndarray(owner, offset: int, nbytes: int):
    """The untyped storage of a ``torch.from_numpy`` tensor: ``nbytes`` of the memory of
    ``owner`` (the array, or another such tensor's storage over more of it) from ``offset``,
    shared as in the run (``torch.from_numpy(memory)`` beside the ``memory`` the program writes
    through)."""
    import torch

    return torch.from_numpy(flat_bytes(owner)[offset:offset + nbytes]).untyped_storage()


def _rebuild_ndarray(name, dtype, shape):
    import numpy as np

    cache = _loading.storages
    arr = cache.get(name)
    if arr is None:
        arr = np.frombuffer(_loading.read_buffer(name), dtype=np.dtype(dtype)).reshape(shape)
        cache[name] = arr
    return arr


def load_graph(stream: bytes, read_buffer, device_tensors: list | None = None):
    """Unpickle a graph; ``read_buffer(name) -> bytearray`` supplies buffer bytes. Every tensor
    comes back on the CPU; those saved on a device are appended to ``device_tensors`` as
    (tensor, saved device), for ``restore.devices`` to place.

    The unpickler is a stack machine: depth costs memory, never recursion."""
    _loading.storages = {}
    _loading.device_storages = {}
    _loading.device_tensors = device_tensors if device_tensors is not None else []
    _loading.read_buffer = read_buffer
    _loading.deferred = []
    ADDED_BY_SETSTATE.clear()
    RUN_IDS.clear()
    GRAD_HOOKS.clear()
    try:
        loaded = pickle.loads(stream)
        for obj, state in _loading.deferred:  # (built now: a failure now is the load's)
            obj.__setstate__(state)
            _note_added(obj, state)
        return loaded
    finally:
        _loading.storages = _loading.device_storages = _loading.device_tensors = _loading.deferred = None
        _loading.read_buffer = None
