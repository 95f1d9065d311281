"""The object-graph pickler: state goes to buffers, live things become placeholders.

``GraphPickler`` runs in the forked writer. It pickles the snapshot's roots with protocol 5 and
intercepts, through ``reducer_override``:

- torch tensors -> ``_rebuild_tensor(storage, offset, size, stride, dtype, ...)`` with the
  storage pickled once per (device, address, size) as a reference to a *buffer*: views and tied
  weights share one buffer and come back sharing one storage; ``.grad`` travels with its tensor.
- numpy arrays (plain dtypes) -> a buffer plus dtype and shape.
- CuPy arrays and cuda.core Buffers -> their span of the staged device range they lie in (a
  cuda.core Buffer over host memory: a buffer of its own, from the bytes the trainee staged).
- objects that cannot or should not be pickled (modules, files, sockets, locks, threads,
  generators, DataLoaders and their iterators, functions that cannot be found by name, anything
  whose ``__reduce_ex__`` raises) -> ``_live_only(serial, type)``: restore keeps the object the
  replayed program built at that place.
- local functions with a closure -> ``_live_function(serial, type)`` with what their cells hold
  as its state: restore keeps the replayed function and merges the cells' contents into its
  cells (an optimizer that only a ``train_step`` closure refers to).
- instances of classes that cannot be found by name (defined inside a function, or made at run
  time: torch's ``ParametrizedLinear``) -> ``_live_object(serial, type)`` with their attributes as
  its state: restore keeps the replayed object and merges the attributes into it.

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

from gpusnap.capture import safepoints
from gpusnap.errors import CaptureError
from gpusnap.graph.iterpickle import IterativePickler
from gpusnap.graph.load import (  # noqa: F401  (re-exported: older snapshots name them here)
    LiveOnly,
    Unbuilt,
    _construct,
    _core_buffer,
    _device_pointer,
    _raw_ndarray,
    _live_function,
    _live_generator,
    _live_object,
    _live_only,
    _load_device_storage,
    _load_storage,
    _rebuild_cupy,
    _sharded_tensor,
    dtensor_layout,
    _module_attribute,
    _rebuild_ndarray,
    _rebuild_tensor,
    _set_state,
    _set_state_by_class,
    load_graph,
)
from gpusnap.stage.drain import Drained
from gpusnap.rawmem import mapped, strided_extent, view_at
from gpusnap.stage.sources import HOST_KINDS

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
# "module.Qualname" -> attributes the snapshot leaves out, so that restore keeps what the replay
# holds there: a framework's references to live objects that the replay, which skips the
# iterations that made some of them, cannot hold alike (accelerate's list of every DataLoader it
# prepared, the evaluations' included).
REPLAYED_ATTRS: dict[str, frozenset[str]] = {}
# "module.Qualname" -> a function of the object giving attributes to save beside its state: what
# the object knows only through a C++ part its __getstate__ leaves out (DDP's gradient buckets).
EXTRA_STATE: dict[str, object] = {}
# "module.Qualname" of a library's generator -> the locals that hold what it fetched ahead of what
# it yielded (accelerate's DataLoaderShard collates one batch ahead): part of the program's state,
# with the random numbers its collation drew. Pickled as a live-only generator with those locals;
# restore writes them into the replay's generator, which livecheck has put at the same place.
FETCHED_AHEAD: dict[str, tuple[str, ...]] = {}
_named: dict[tuple[type, int], bool] = {}
_replayed_attrs_of: dict[type, frozenset[str]] = {}


def _is_named(cls, names: set[str]) -> bool:
    key = (cls, id(names))
    found = _named.get(key)
    if found is None:
        found = _named[key] = any(f"{k.__module__}.{k.__qualname__}" in names for k in cls.__mro__)
    return found


def _replayed_attrs(cls) -> frozenset[str]:
    found = _replayed_attrs_of.get(cls)
    if found is None:
        names = (REPLAYED_ATTRS.get(f"{k.__module__}.{k.__qualname__}", ()) for k in cls.__mro__)
        found = _replayed_attrs_of[cls] = frozenset().union(*names)
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
    [(tensor, storage key)] for the path pass, ``storage_names`` {storage key: buffer name},
    ``storage_offsets`` {storage key: byte offset in that buffer} where it is not 0,
    ``device_wanted`` {staged range name: (dtype, typesize)}: the device ranges the graph's
    storages lie in, which the writer then stores (``stage.put_ranges``), and ``core_buffers``
    [(cuda.core Buffer, buffer name; None when closed or empty)] for the path pass. ``device``
    is the ``stage.device.DeviceStage`` of this snapshot (None: the program holds no device
    memory).
    ``drained`` says which CPU memory the writer moved to its drain region of the staging arena
    (stage.drain): those bytes are read there, never at their address.
    """

    def __init__(self, file, sink, drained: Drained | None = None, device=None, unforked=None):
        super().__init__(file, protocol=PROTOCOL)
        self._file = file
        self.iterative = False  # dump_graph fell back to the iterative pickler
        self.sink = sink
        self.host = HostMemory(drained, unforked)
        self.buffers: dict[str, dict] = {}
        self.live_only: list[tuple[object, str]] = []
        self.tensors: list[tuple[object, str]] = []
        self.storage_names: dict[tuple, str] = {}
        self.storage_offsets: dict[tuple, int] = {}
        self.device_wanted: dict[str, tuple[str, int]] = {}
        self.core_buffers: list[tuple[object, str | None]] = []
        self._storage_dtype: dict[tuple, tuple[str, int]] = {}
        self._torch = sys.modules.get("torch")
        self._np = sys.modules.get("numpy")
        self._cupy = sys.modules.get("cupy")
        core = sys.modules.get("cuda.core")
        self._core_buffer = getattr(core, "Buffer", None)
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
        if self._cupy is not None and type(obj) is self._cupy.ndarray:
            return self._reduce_cupy(obj)
        if self._core_buffer is not None and isinstance(obj, self._core_buffer):
            return self._reduce_core_buffer(obj)
        if type(obj) is types.GeneratorType and obj.gi_suspended:
            if safepoints.instrumented(obj.gi_code):
                return self._live_generator(obj)
            ahead = FETCHED_AHEAD.get(f"{obj.gi_frame.f_globals.get('__name__')}.{obj.__qualname__}") if FETCHED_AHEAD else None
            if ahead:
                return self._live_generator(obj, ahead)
        if isinstance(obj, self._live_types) or (LIVE_NAMES and _is_named(type(obj), LIVE_NAMES)):
            return self._live(obj)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) and _findable(obj):
            return NotImplemented
        if type(obj) in (types.MethodType, types.BuiltinFunctionType):
            return self._reduce_method(obj)
        if type(obj) is types.FunctionType and obj.__closure__:
            return self._live_function(obj)
        if isinstance(obj, (type, types.FunctionType)):
            return self._live(obj)
        if not _findable(type(obj)):
            return self._live_object(obj)
        try:
            reducer = copyreg.dispatch_table.get(type(obj))
            rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
            if WHOLE_STATE and _is_named(type(obj), WHOLE_STATE) and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict):
                rv = (*rv[:2], dict(vars(obj)), *rv[3:])
            extra = EXTRA_STATE.get(f"{type(obj).__module__}.{type(obj).__qualname__}") if EXTRA_STATE else None
            if extra is not None and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict):
                rv = (*rv[:2], {**rv[2], **extra(obj)}, *rv[3:])
            if REPLAYED_ATTRS and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict) and _replayed_attrs(type(obj)):
                left_out = _replayed_attrs(type(obj))
                rv = (*rv[:2], {k: v for k, v in rv[2].items() if k not in left_out}, *rv[3:])
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

    def _live_generator(self, gen, names=None):
        """A suspended generator of instrumented code: live-only, with its locals as the
        placeholder's state (restore runs the replay's to the same place, then writes them).
        ``names``: only these locals (a library generator's data fetched ahead)."""
        _, args = self._live(gen)
        local = {name: value for name, value in gen.gi_frame.f_locals.items()
                 if "__gpusnap_" not in name and (names is None or name in names)}
        return _live_generator, args, (gen.gi_code.co_qualname, local)

    def _live_function(self, obj):
        """A closure: live-only, with its cells' contents as the placeholder's state (pickled after
        the placeholder is memoized, so a cell that refers back to the function is no cycle)."""
        _, args = self._live(obj)
        cells = {}
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__):
            if name == "__class__":  # zero-argument super()'s: the class, which replay defines anew
                continue
            try:
                cells[name] = cell.cell_contents
            except ValueError:  # a variable not bound yet
                continue
        return _live_function, args, (obj.__code__.co_qualname, cells)

    def _live_object(self, obj):
        """An object whose class pickle cannot name: live-only, with its ``__dict__`` and slots as
        the placeholder's state. Not what its ``__getstate__`` gives (a parametrized module's
        refuses): restore merges these into the replay's object, and never builds one."""
        _, args = self._live(obj)
        attrs = getattr(obj, "__dict__", None)
        slots = {}
        for name in copyreg._slotnames(type(obj)):
            try:
                slots[name] = object.__getattribute__(obj, name)
            except AttributeError:  # a slot not set
                continue
        if not isinstance(attrs, dict) and not slots:
            return _live_only, args
        attrs = dict(attrs or {})
        if REPLAYED_ATTRS and _replayed_attrs(type(obj)):
            left_out = _replayed_attrs(type(obj))
            attrs = {k: v for k, v in attrs.items() if k not in left_out}
        return _live_object, args, (type(obj).__qualname__, attrs, slots)

    def _live(self, obj):
        serial = len(self.live_only)
        name = type_name(obj) if not isinstance(obj, type) else f"class {obj.__module__}.{obj.__qualname__}"
        self.live_only.append((obj, name))
        return _live_only, (serial, name)

    # -- torch ----------------------------------------------------------------------------
    def _reduce_dtensor(self, t):
        """A DTensor (FSDP2's parameters and optimizer state, tensor parallelism): its bytes are
        this rank's local shard, a plain tensor; its mesh and placements say how the shards make
        the whole. Restore merges the local shard into the replay's DTensor (``ShardedState``)."""
        grad = t.grad if t.is_leaf else None
        return _sharded_tensor, (t._local_tensor, dtensor_layout(t), tuple(t._spec.placements), tuple(t.shape), tuple(t.stride()),
                                 t.requires_grad and t.is_leaf, isinstance(t, self._torch.nn.Parameter), grad)

    def _reduce_tensor(self, t):
        torch = self._torch
        if _is_named(type(t), _SHARDED_TENSORS):
            return self._reduce_dtensor(t)
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
        device, address, nbytes = key
        if device not in ("cpu", "meta") and nbytes:
            return self._reduce_device_storage(storage, key)
        name = self.storage_names.get(key)
        if name is None:
            if device == "cpu":
                view = self.host.view(address, nbytes, "CPU tensor")
            else:
                view = None
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

    def _reduce_device_storage(self, storage, key):
        """A device storage: a reference to the staged range it lies in, at its offset. The
        range is written after the graph (``device_wanted``); its bytes were copied off the
        device in the stall, and the writer never reads device memory."""
        device, address, nbytes = key
        index = storage.device.index or 0
        found = self.device.containing(index, address, nbytes) if self.device is not None else None
        if found is None:
            # Keeping the replayed device tensor on restore would be a silent partial restore:
            # fail the snapshot instead (training goes on).
            raise CaptureError(
                f"a {device}:{index} storage of {nbytes:,} bytes at {address:#x} lies outside the device memory "
                "gpusnap staged (memory that torch's caching allocator, cuda-python and CuPy did not hand out)",
                hint="this snapshot fails and training goes on; gpusnap reads torch's native caching allocator "
                     "(not PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, a pluggable allocator or "
                     "PYTORCH_NO_CUDA_MEMORY_CACHING)",
            )
        staged, offset = found
        name = staged.range.name
        self.device_wanted.setdefault(name, self._storage_dtype.get(key, ("uint8", 1)))
        self.storage_names[key] = name
        if offset:
            self.storage_offsets[key] = offset
        return _load_device_storage, (name, offset, nbytes, f"{device}:{index}")

    # -- cupy -----------------------------------------------------------------------------
    def _reduce_cupy(self, arr):
        """A CuPy array: its span of the staged range its memory lies in (CuPy's own pickling
        would copy it off the GPU, which a forked writer cannot)."""
        address = arr.data.ptr
        lowest, nbytes = strided_extent(address, arr.shape, arr.strides, arr.itemsize)
        device = int(arr.data.device_id)
        found = self.device.containing(device, lowest, nbytes) if self.device is not None and nbytes else None
        if found is None:
            if not nbytes:
                return _rebuild_cupy, (None, 0, 0, arr.dtype.str, arr.shape, arr.strides, f"cuda:{device}")
            raise CaptureError(f"a CuPy array of {nbytes:,} bytes on cuda:{device} lies outside the device memory gpusnap staged")
        staged, offset = found
        self.device_wanted.setdefault(staged.range.name, (arr.dtype.name, arr.itemsize))
        return _rebuild_cupy, (staged.range.name, offset, nbytes, arr.dtype.str, arr.shape,
                               tuple(arr.strides), f"cuda:{device}", address - lowest)

    # -- cuda.core ------------------------------------------------------------------------
    def _reduce_core_buffer(self, buf):
        """A cuda.core Buffer: its span of the staged range it lies in, or, over host memory, a
        buffer of its own from the copy the trainee staged. Its own pickling exports an IPC
        handle (a CUDA call, which a forked writer cannot make), and so may its properties: the
        writer reads ``handle``, ``size`` and ``is_closed`` only, the rest from the stage."""
        if buf.is_closed or not buf.size:
            self.core_buffers.append((buf, None))
            return _core_buffer, (None, 0, 0, -1, "closed" if buf.is_closed else "empty")
        address, nbytes = int(buf.handle), int(buf.size)
        where = self.device.core.get(address) if self.device is not None else None
        found = None
        if where is not None and where[1] in HOST_KINDS:
            found = self._core_host_buffer(address, nbytes, where[1])
        elif where is not None:
            staged = self.device.containing(where[0], address, nbytes)
            if staged is not None:
                self.device_wanted.setdefault(staged[0].range.name, ("uint8", 1))
                found = staged[0].range.name, staged[1]
        if found is None:
            raise CaptureError(
                f"a cuda.core Buffer of {nbytes:,} bytes at {address:#x} lies outside the memory gpusnap staged",
                hint="this snapshot fails and training goes on; please report this with how the Buffer was made")
        name, offset = found
        self.core_buffers.append((buf, name))
        return _core_buffer, (name, offset, nbytes, where[0], where[1])

    def _core_host_buffer(self, address: int, nbytes: int, kind: str) -> tuple[str, int]:
        """(buffer name, 0) of a Buffer over host memory, written on first meeting from the copy
        the trainee staged (``HostMemory``: fork does not pass pinned memory on)."""
        key = ("core", address, nbytes)
        name = self.storage_names.get(key)
        if name is None:
            name = self.storage_names[key] = f"c{len(self.storage_names)}"
            view = self.host.view(address, nbytes, f"cuda.core {kind} Buffer")
            record = self.sink.put_buffer(view, dtype="uint8", typesize=1)
            record.update(kind="core", device="cpu", memory=kind)
            self.buffers[name] = record
        return name, 0

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
        """``arr`` over the bytes it had at fork: in place, or in the staging arena where the
        writer drained them or the trainee staged them (unforked memory)."""
        address = arr.__array_interface__["data"][0]
        lowest, nbytes = strided_extent(address, arr.shape, arr.strides, arr.itemsize)
        if not nbytes:
            return arr
        view = self.host.view(lowest, nbytes, "numpy array")
        return self._np.ndarray(arr.shape, arr.dtype, buffer=view, offset=address - lowest, strides=arr.strides)


class HostMemory:
    """The trainee's host memory as it was at fork, read in the writer: a drained range from the
    drain region (``stage.drain``), memory fork did not pass on from the ``pinned`` region
    (``stage.unforked``), the rest in place."""

    def __init__(self, drained: Drained | None = None, unforked=None):
        self.drained = drained or Drained()
        self.unforked = unforked

    def view(self, address: int, nbytes: int, what: str = "buffer") -> memoryview:
        if not nbytes:
            return memoryview(b"")
        found = self.drained.view(address, nbytes)
        if found is None and self.unforked is not None:
            found = self.unforked.view(address, nbytes)
        return found if found is not None else _host_view(address, nbytes, what)


def _host_view(address: int, nbytes: int, what: str) -> memoryview:
    """A view of host memory in the writer, or a ``CaptureError`` where the fork did not pass
    the memory on (the writer would die reading it)."""
    if not mapped(address, nbytes):
        raise CaptureError(
            f"a {what} of {nbytes:,} bytes at {address:#x} is not in the forked writer's memory: the program "
            "page-locked it (CUDA pinned memory, as a DataLoader with pin_memory=True makes) or marked it "
            "do-not-fork, and gpusnap does not stage such host memory yet",
            hint="this snapshot fails and training goes on; move pinned batches to the GPU under the same name "
                 "(x = x.to(device)) so the training loop holds none at its boundary, or use pin_memory=False",
        )
    return view_at(address, nbytes)


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
