"""The object-graph pickler: state goes to buffers, live things become placeholders.

``GraphPickler`` runs in the forked writer. It pickles the snapshot's roots with protocol 5 and
intercepts, through ``reducer_override``:

- torch tensors -> ``_rebuild_tensor(storage, offset, size, stride, dtype, ...)`` with the
  storage pickled once per (device, address, size) as a reference to a *buffer*: views and tied
  weights share one buffer and come back sharing one storage; ``.grad`` travels with its tensor.
- numpy arrays (plain dtypes) -> a buffer plus dtype and shape.
- objects that cannot or should not be pickled (modules, files, sockets, locks, threads,
  generators, DataLoaders and their iterators, functions that cannot be found by name, anything
  whose ``__reduce_ex__`` raises) -> ``_live_only(serial, type)``: restore keeps the object the
  replayed program built at that place.

Buffer bytes never pass through the pickle stream: ``sink.put_buffer`` receives a memoryview over
the storage's own memory (the fork gave the writer a consistent copy), so the stream holds only
structure. Nothing here runs a torch operator: the writer is a forked child and torch's OpenMP
pool would deadlock it. Reading tensor metadata and CPU storage bytes is safe.

A graph deeper than the C pickler can go (it recurses once per level) is written again by
``graph.iterpickle.IterativePickler`` with the same reductions. Reductions whose constructor
could refuse a placeholder argument at load time go through ``graph.load._construct``.
Loading (``graph.load.load_graph``) uses the reconstruction functions of ``graph.load``, which
fetch buffers through ``read_buffer(name)``, once per buffer.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import threading
import types
import weakref

from gpusnap.errors import CaptureError
from gpusnap.graph.iterpickle import IterativePickler
from gpusnap.graph.load import (  # noqa: F401  (re-exported: older snapshots name them here)
    LiveOnly,
    Unbuilt,
    _construct,
    _device_pointer,
    _raw_ndarray,
    _live_only,
    _load_storage,
    _module_attribute,
    _rebuild_ndarray,
    _rebuild_tensor,
    _set_state,
    _set_state_by_class,
    load_graph,
)
from gpusnap.stage.drain import Drained
from gpusnap.stage.memory import address_view

PROTOCOL = 5

_ALWAYS_LIVE = (
    types.ModuleType,
    types.FrameType,
    types.TracebackType,
    types.CodeType,
    types.GeneratorType,
    types.CoroutineType,
    types.AsyncGeneratorType,
    weakref.ref,
    weakref.ProxyType,
    weakref.CallableProxyType,
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Thread,
    threading.Condition,
    threading.Event,
    threading.Semaphore,
    threading.Barrier,
    io.IOBase,
)


# Classes named "module.Qualname" (any class in the MRO; gpusnap.frameworks adds them):
# LIVE_NAMES are kept live-only (a framework's iterators, whose pickled state would be wrong);
# WHOLE_STATE are pickled with their whole __dict__, not what their __getstate__ returns, which
# leaves out what a process that goes on needs (a LightningModule's trainer) because it was
# written for sending a copy elsewhere.
LIVE_NAMES: set[str] = set()
_SHARDED_TENSORS = {"torch.distributed.tensor.DTensor", "torch.distributed._tensor.api.DTensor",
                    "torch.distributed.tensor._api.DTensor"}
WHOLE_STATE: set[str] = set()
_named: dict[tuple[type, int], bool] = {}


def _is_named(cls, names: set[str]) -> bool:
    key = (cls, id(names))
    found = _named.get(key)
    if found is None:
        found = _named[key] = any(f"{k.__module__}.{k.__qualname__}" in names for k in cls.__mro__)
    return found


def type_name(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _findable(obj) -> bool:
    """True when pickle can save ``obj`` (a function or class) by reference to its name."""
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


class GraphPickler(pickle.Pickler):
    """Pickles roots; writes buffers to ``sink.put_buffer(view, dtype=, typesize=)``.

    After ``dump``: ``buffers`` {name: record}, ``live_only`` [(obj, type name)], ``tensors``
    [(tensor, storage key)] for the path pass, ``storage_names`` {storage key: buffer name}.
    ``staged`` maps (device type, address, nbytes) of device storages to host views (the
    staging step fills it; empty in CPU mode). ``drained`` says which CPU memory the writer
    moved to its drain region of the staging arena (stage.drain): those bytes are read there, never at their address.
    """

    def __init__(self, file, sink, staged: dict | None = None, drained: Drained | None = None, device=None):
        super().__init__(file, protocol=PROTOCOL)
        self._file = file
        self.iterative = False  # dump_graph fell back to the iterative pickler
        self.sink = sink
        self.staged = staged or {}
        self.drained = drained or Drained()
        self.buffers: dict[str, dict] = {}
        self.live_only: list[tuple[object, str]] = []
        self.tensors: list[tuple[object, str]] = []
        self.storage_names: dict[tuple, str] = {}
        self._storage_dtype: dict[tuple, tuple[str, int]] = {}
        self._torch = sys.modules.get("torch")
        self._np = sys.modules.get("numpy")
        self._live_types = _ALWAYS_LIVE + _torch_live_types(self._torch)
        # CUdeviceptr values inside a staged raw allocation are saved as (allocation, offset):
        # the replay's allocation has another base (stage.device.DeviceStage.pointer).
        self.device = device
        driver = sys.modules.get("cuda.bindings.driver") if device is not None else None
        self._pointer_type = getattr(driver, "CUdeviceptr", None)

    def dump_graph(self, obj) -> None:
        """``dump``, or, where the graph is deeper than the C pickler can go, the same stream
        written by ``IterativePickler``. Buffers already put stay put (their names are kept)."""
        try:
            self.dump(obj)
            return
        except RecursionError:
            pass
        self._file.seek(0)
        self._file.truncate()
        self.live_only.clear()
        self.tensors.clear()
        self.iterative = True
        IterativePickler(self._file, self.reducer_override).dump(obj)

    # -- dispatch -----------------------------------------------------------------------
    def reducer_override(self, obj):
        torch = self._torch
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                return self._reduce_tensor(obj)
            if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
                return self._reduce_storage(obj)
        if self._pointer_type is not None and type(obj) is self._pointer_type:
            where = self.device.pointer(int(obj))
            if where is not None:
                return _device_pointer, where
        np = self._np
        if np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject and obj.dtype.names is None:
            return self._reduce_ndarray(obj)
        if isinstance(obj, self._live_types) or (LIVE_NAMES and _is_named(type(obj), LIVE_NAMES)):
            return self._live(obj)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) and _findable(obj):
            return NotImplemented
        if type(obj) in (types.MethodType, types.BuiltinFunctionType):
            return self._reduce_method(obj)
        if isinstance(obj, (type, types.FunctionType)):
            return self._live(obj)
        if not _findable(type(obj)):
            return self._live(obj)
        try:
            reducer = copyreg.dispatch_table.get(type(obj))
            rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
            if WHOLE_STATE and _is_named(type(obj), WHOLE_STATE) and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict):
                rv = (*rv[:2], dict(vars(obj)), *rv[3:])
            return _guarded(obj, rv)
        except Exception:
            return self._live(obj)

    def _reduce_method(self, obj):
        """A module's own (``random.randint``, a method of its generator) by name; a method of
        a Python object as getattr(owner, name), the owner in the graph, so restore binds it to
        the owner's live counterpart (merge); a builtin as getattr(its class or module, name)
        (``torch.mean``). A builtin bound to an instance stays live-only: a copy of that
        instance would take its place."""
        name, owner = getattr(obj, "__name__", None), getattr(obj, "__self__", None)
        # A builtin's __module__ is None: random.random is found through its owner's class.
        for module in (getattr(obj, "__module__", None), type(owner).__module__):
            if module in sys.modules and name and getattr(sys.modules[module], name, None) == obj:
                return _module_attribute, (module, name)
        if type(obj) is types.BuiltinFunctionType and not (owner is None or isinstance(owner, (type, types.ModuleType))):
            return self._live(obj)
        try:
            rv = obj.__reduce_ex__(PROTOCOL)
        except Exception:
            return self._live(obj)
        return _guarded(obj, rv) if isinstance(rv, tuple) else self._live(obj)

    def _live(self, obj):
        serial = len(self.live_only)
        name = type_name(obj) if not isinstance(obj, type) else f"class {obj.__module__}.{obj.__qualname__}"
        self.live_only.append((obj, name))
        return _live_only, (serial, name)

    # -- torch ----------------------------------------------------------------------------
    def _reduce_tensor(self, t):
        torch = self._torch
        if _is_named(type(t), _SHARDED_TENSORS):
            # Its bytes live in a local shard behind a wrapper that has no storage of its own;
            # kept live-only, the restart would silently keep the replay's weights.
            raise CaptureError(f"{type_name(t)} (FSDP2's fully_shard, tensor parallelism) is not captured yet: no snapshot "
                               "of a program that holds one", hint="wrap the model with DistributedDataParallel, or use FSDP1")
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
            try:
                return _guarded(t, t.__reduce_ex__(PROTOCOL))
            except Exception:
                return self._live(t)
        storage = t.untyped_storage()
        dtype = str(t.dtype).removeprefix("torch.")
        key = _storage_key(storage)
        self._storage_dtype.setdefault(key, (dtype, t.element_size()))
        is_param = type(t) is torch.nn.Parameter
        grad = t.grad if t.is_leaf else None
        attrs = dict(t.__dict__) if t.__dict__ else None
        requires_grad = t.requires_grad and t.is_leaf
        self.tensors.append((t, key))
        args = (storage, t.storage_offset(), tuple(t.size()), tuple(t.stride()), dtype, requires_grad, grad, is_param, attrs)
        return _rebuild_tensor, args

    def _reduce_storage(self, storage):
        torch = self._torch
        if isinstance(storage, torch.TypedStorage):
            storage = storage.untyped()
        key = _storage_key(storage)
        name = self.storage_names.get(key)
        if name is None:
            device, address, nbytes = key
            if device == "cpu":
                view = self.drained.view(address, nbytes) or address_view(address, nbytes)
            elif key in self.staged:
                view = self.staged[key]
            elif device == "meta":
                view = None
            else:
                # Keeping the replayed device tensor on restore would be a silent partial
                # restore: refuse the snapshot instead (training goes on).
                raise CaptureError(
                    f"the program holds {device} memory ({nbytes} bytes in one storage), and "
                    "device memory capture is not implemented yet (CPU mode)"
                )
            dtype, typesize = self._storage_dtype.get(key, ("uint8", 1))
            name = f"t{len(self.storage_names)}"
            self.storage_names[key] = name
            if view is None:
                record = {"nbytes": nbytes, "dtype": dtype, "chunks": []}
            else:
                record = self.sink.put_buffer(view, dtype=dtype, typesize=typesize)
            record.update(kind="torch", device=device, device_index=storage.device.index)
            self.buffers[name] = record
        return _load_storage, (name, key[0])

    # -- numpy ----------------------------------------------------------------------------
    def _reduce_ndarray(self, arr):
        np = self._np
        if self.device is not None:
            # An array over a raw allocation (managed memory seen from the host): its bytes are
            # the allocation's, staged by the parent; the writer must never read them there (a
            # forked child faults on managed memory). It comes back as a view of the replay's.
            where = self.device.pointer(arr.__array_interface__["data"][0])
            if where is not None:
                return _raw_ndarray, (*where, arr.dtype.str, arr.shape, arr.strides)
        key = ("numpy", arr.__array_interface__["data"][0], arr.nbytes, arr.dtype.str, arr.shape, arr.strides)
        name = self.storage_names.get(key)
        if name is None:
            name = f"n{len(self.storage_names)}"
            self.storage_names[key] = name
            flat = np.ascontiguousarray(self._readable(arr)).reshape(-1).view(np.uint8)  # copies only if strided
            record = self.sink.put_buffer(memoryview(flat), dtype=arr.dtype.name, typesize=arr.dtype.itemsize)
            record.update(kind="numpy", shape=list(arr.shape))
            self.buffers[name] = record
        return _rebuild_ndarray, (name, arr.dtype.str, arr.shape)

    def _readable(self, arr):
        """``arr``, or the same array over the drain region when its memory was drained (a tensor's)."""
        address = arr.__array_interface__["data"][0]
        lo = hi = address
        for n, stride in zip(arr.shape, arr.strides):
            if n == 0:
                return arr
            lo, hi = (lo + (n - 1) * stride, hi) if stride < 0 else (lo, hi + (n - 1) * stride)
        found = self.drained.locate(lo, hi + arr.itemsize)
        if found is None:
            return arr
        start, offset = found
        region = self.drained.region_view()[offset : offset + hi + arr.itemsize - start]
        return self._np.ndarray(arr.shape, arr.dtype, buffer=region, offset=address - start, strides=arr.strides)


def _guarded(obj, rv):
    """A reduction made safe to load. Its constructor may refuse what it is given at load time (a
    placeholder for a live-only argument): it is routed through ``_construct``, which then yields
    ``Unbuilt``; plain ``cls.__new__(cls)`` cannot refuse and stays as it is (pickle's compact
    NEWOBJ). Its state goes through ``_set_state`` where the class has a ``__getattr__`` and no
    ``__setstate__``: pickle's BUILD would ask the half-built object for ``__setstate__``; and
    through ``_set_state_by_class`` where the class has its own ``__setstate__``, which notes
    what that method adds (merge keeps the live object's own live resources)."""
    if isinstance(rv, str):
        return rv
    func, args = rv[0], rv[1]
    rest = tuple(rv[2:])
    cls = type(obj)
    if rest and rest[0] is not None and len(rest) < 4:
        if not hasattr(cls, "__setstate__"):
            if hasattr(cls, "__getattr__"):
                rest = (rest + (None, None))[:3] + (_set_state,)
        elif isinstance(rest[0], dict) or (isinstance(rest[0], tuple) and len(rest[0]) == 2 and isinstance(rest[0][0], dict)):
            rest = (rest + (None, None))[:3] + (_set_state_by_class,)
    if func is copyreg.__newobj__ and args and getattr(args[0], "__new__", None) is object.__new__:
        return (func, args, *rest)
    return (_construct, (func, args, type_name(obj)), *rest)


def _storage_key(storage) -> tuple:
    return (storage.device.type, storage.data_ptr(), storage.nbytes())


def _torch_live_types(torch) -> tuple:
    if torch is None:
        return ()
    found = []
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        found += [data.DataLoader, data.dataloader._BaseDataLoaderIter]
    found += [torch.Stream, torch.Event] if hasattr(torch, "Stream") else []
    return tuple(found)


# Snapshots written before gpusnap.graph existed name these functions here.
__all__ = ["GraphPickler", "LiveOnly", "Unbuilt", "load_graph", "type_name"]
