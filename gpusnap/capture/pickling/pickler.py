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
- objects whose state a native library holds (``UNKEPT``, ``frameworks/writers.py``: an SQLite
  connection inside a transaction, an open Parquet writer, a gzip file open for writing) ->
  ``_unkept(type, why, hint)``: restore refuses there.
- weak mappings and sets (``WeakKeyDictionary``, ``WeakValueDictionary``: activation statistics
  keyed by module; ``WeakSet``) -> ``_weak_mapping(kind, items)``, ``_weak_set(items)``: their
  weak references would be live-only, and the replay's kept setup's entries.
- logging handlers -> ``_log_handler(class, state)`` (their lock left out, a FileHandler's file
  reopened at its next record, the standard streams by name): the loggers that hold them are kept
  by ``graph.roots.loggers``.
- torch hook handles -> ``_hook_handle(hooks dict, id, extra dicts)``, the dicts held strongly
  (torch's own state holds them by weak reference, which restore could not point at the live
  dicts).
- NumPy memmaps over a file (read-only, or written in place) -> ``_live_memmap(serial, type,
  state)``: the file mapped again where the replay made none (by value, their bytes went into
  every snapshot, and a step's writes reached no file after a restart).
- files the program writes through (``open()``'s, on a path the file watch records) ->
  ``_live_file(serial, type, reopen state)``: live-only, and where the replay made none at
  their place (opened after setup), restore opens the path again at the snapshot's offset.
- objects that write through a file (``OVER_FILES``: a ``csv.writer``) -> ``_live_over_file``
  with their file and how to make them again over it.
- in-memory files (``io.BytesIO``, ``io.StringIO``) -> their own reduction, contents and position:
  a report kept in a StringIO until the end, the best weights torch.save'd into a BytesIO. Other
  files are the replay's; these hold nothing but program state.
- local functions -> ``_live_function(serial, type)`` with their first line and what their cells hold
  as its state: restore keeps the replayed function and merges the cells' contents into its
  cells (an optimizer that only a ``train_step`` closure refers to); where the replay made none,
  it makes the function again from its code, over the replay's frame cells it shared.
- classes of the program's that cannot be found by name (defined inside a function) ->
  ``_live_class(serial, type)`` with their class attributes (``graph.roots.class_state``) as
  its state: restore keeps the replayed class and sets them on it.
- instances of classes that cannot be found by name (defined inside a function, or made at run
  time) -> ``_live_object(serial, type)`` with their attributes as its state: restore keeps the
  replayed object and merges the attributes into it. Those of the classes torch makes one per
  object (a parametrized module's ``ParametrizedLinear``, a torch.fx ``GraphModuleImpl``) are
  made again instead (``graph.madeclasses``).

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

import contextlib
import copyreg
import enum
import io
import mmap
import pickle
import sys
import threading
import types
import weakref

from gpusnap.capture.pickling.reducers import BufferReducers, HostMemory, InlineArray, _is_named
from gpusnap.capture.safepoints import returnable as safepoints
from gpusnap.files import disk
from gpusnap.graph import madeclasses, roots
from gpusnap.graph.iterpickle import IterativePickler
from gpusnap.graph.load import (
    MEMORY_FILES,
    WEAK_MAPPINGS,
    _bound_method,
    _construct,
    _device_pointer,
    _hook_handle,
    _live_builtin_method,
    _live_class,
    _live_file,
    _live_function,
    _live_generator,
    _live_memmap,
    _live_object,
    _live_only,
    _live_over_file,
    _log_handler,
    _module_attribute,
    _set_state,
    _set_state_by_class,
    _unkept,
    _weak_mapping,
    _weak_set,
    _with_run_id,
    findable,
)
from gpusnap.graph.walk import slot_values
from gpusnap.stage.drain import Drained

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
WHOLE_STATE: set[str] = set()
# "module.Qualname" -> attributes the snapshot leaves out, so that restore keeps what the replay
# holds there: a framework's references to live objects that the replay, which skips the
# iterations that made some of them, cannot hold alike (accelerate's list of every DataLoader it
# prepared, the evaluations' included).
REPLAYED_ATTRS: dict[str, frozenset[str]] = {}
# "module.Qualname" (any class in the MRO) -> a function of the object giving attributes to save
# beside its state: what the object knows only through a C++ part its __getstate__ leaves out
# (DDP's gradient buckets), or what a subclass added that its base's __getstate__ leaves out (an
# optimizer's base optimizer).
EXTRA_STATE: dict[str, object] = {}
# "module.Qualname" of a library's generator -> the locals that hold what it fetched ahead of what
# it yielded (accelerate's DataLoaderShard collates one batch ahead): part of the program's state,
# with the random numbers its collation drew. Pickled as a live-only generator with those locals;
# restore writes them into the replay's generator, which livecheck has put at the same place.
FETCHED_AHEAD: dict[str, tuple[str, ...]] = {}
# "module.Qualname" (any class in the MRO) -> (holds(obj), why, hint): an object whose state lives
# where neither the object graph nor a file the snapshot keeps can carry it (a native library's
# memory), while ``holds(obj)`` says it holds some. Pickled as ``_unkept``: restore refuses there,
# saying why, rather than go on with the replay's object (gpusnap.frameworks.writers). ``holds``
# runs in the forked writer: it reads a field, and calls nothing that could wait on a lock.
UNKEPT: dict[str, tuple] = {}
_unkept_of: dict[tuple, tuple | None] = {}
# "module.Qualname" (any class in the MRO) -> a function of the object giving (file, build, params)
# or None: an object that writes through a file it holds where pickle cannot reach (a
# csv.writer), pickled as ``_live_over_file`` with those: restore keeps the replay's, or makes it
# again over the file's live counterpart (gpusnap.frameworks.writers).
OVER_FILES: dict[str, object] = {}
_over_files_of: dict[tuple, object] = {}
_replayed_attrs_of: dict[type, frozenset[str]] = {}
_extra_state_of: dict[tuple, object] = {}


def _replayed_attrs(cls) -> frozenset[str]:
    found = _replayed_attrs_of.get(cls)
    if found is None:
        names = (REPLAYED_ATTRS.get(f"{k.__module__}.{k.__qualname__}", ()) for k in cls.__mro__)
        found = _replayed_attrs_of[cls] = frozenset().union(*names)
    return found


def _by_class(table: dict, cache: dict, cls):
    """``table``'s entry for the first class in ``cls``'s MRO it names ("module.Qualname"), or None."""
    key = (cls, len(table))  # a framework registered later is seen
    found = cache.get(key, cache)
    if found is cache:
        names = (f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__)
        found = cache[key] = next((table[name] for name in names if name in table), None)
    return found


def _extra_state(cls):
    return _by_class(EXTRA_STATE, _extra_state_of, cls)


def _unkept_state(obj) -> tuple[str, str, str] | None:
    """(type name, why, hint) where ``obj`` holds state UNKEPT names, else None. Text over such a
    stream (``gzip.open(path, "wt")``) is judged by the stream: it is all the graph holds."""
    if type(obj) is io.TextIOWrapper:
        try:
            obj = obj.buffer
        except Exception:  # noqa: BLE001 - detached
            return None
    entry = _by_class(UNKEPT, _unkept_of, type(obj))
    if entry is None:
        return None
    holds, why, hint = entry
    try:
        return (type_name(obj), why, hint) if holds(obj) else None
    except Exception:  # noqa: BLE001 - a closed or broken object holds nothing
        return None


def type_name(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


# Iterators over a sequence, whose types pickle cannot name but whose own reduction is
# ``iter(sequence)`` (or ``reversed``) and their position: saved by value, exactly where they
# stood, with the sequence itself (the program's, when the graph holds it too). An
# ``itertools.cycle`` past its first pass is one of these over the batches it saved; a list of
# batches the program advances by hand (``next(it)``) is another.
_SEQUENCE_ITERATORS = tuple({type(iter(x)) for x in ([], (), range(0), "", b"", bytearray())} | {type(reversed([]))})


def _programs(cls: type) -> bool:
    """Is the class defined in one of the program's own sources (the main script, its modules)?"""
    module = sys.modules.get(cls.__module__)
    return getattr(module, "__file__", None) in roots.instrumented_sources() or cls.__module__ == "__main__"


class GraphPickler(BufferReducers, pickle.Pickler):
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

    def __init__(self, file, sink, drained: Drained | None = None, device=None, unforked=None, frame_cells=None):
        super().__init__(file, protocol=PROTOCOL)
        self._file = file
        self.iterative = False  # dump_graph fell back to the iterative pickler
        self.sink = sink
        self.host = HostMemory(drained, unforked)
        self.buffers: dict[str, dict] = {}
        self.live_only: list[tuple[object, str]] = []
        # ids of the generators of entered ``contextmanager``s (a ``with`` a loop runs inside;
        # instrument.transform): suspended at their yield, their locals are the state the exit
        # puts back, library code's too
        self.context_generators: set[int] = set()
        self.tensors: list[tuple[object, str]] = []
        self.storage_names: dict[tuple, str] = {}
        self.storage_offsets: dict[tuple, int] = {}
        self.device_wanted: dict[str, tuple[str, int]] = {}
        self.core_buffers: list[tuple[object, str | None]] = []
        self._storage_dtype: dict[tuple, tuple[str, int]] = {}
        # {start address: (nbytes, owner)} of the host memory pickled so far: a torch storage or
        # a contiguous NumPy array (``BufferReducers._shared_host``)
        self._host_memory: dict[int, tuple[int, object]] = {}
        self._torch = sys.modules.get("torch")
        self._np = sys.modules.get("numpy")
        self._cupy = sys.modules.get("cupy")
        # Generators whose reduction makes their state anew (``BufferReducers._reduce_made_state``)
        numpy_random = sys.modules.get("numpy.random")
        self._generator_types = tuple(kind for kind in (getattr(self._torch, "Generator", None),
                                                        getattr(numpy_random, "RandomState", None),
                                                        getattr(numpy_random, "BitGenerator", None)) if kind is not None)
        core = sys.modules.get("cuda.core")
        self._core_buffer = getattr(core, "Buffer", None)
        self._live_types = _ALWAYS_LIVE + _torch_live_types(self._torch)
        hooks = getattr(getattr(self._torch, "utils", None), "hooks", None)  # (None: no torch, or half imported)
        self._handle_type = getattr(hooks, "RemovableHandle", None)
        self._log_handler_type = getattr(sys.modules.get("logging"), "Handler", None)
        # CUdeviceptr values inside a staged raw allocation are saved as (allocation, offset):
        # the replay's allocation has another base (stage.device.DeviceStage.pointer).
        self.device = device
        self._frame_cells = frame_cells or {}
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
        if type(obj) is InlineArray:
            return obj.__reduce__()
        if isinstance(obj, self._generator_types):
            return self._reduce_made_state(obj)
        if np is not None and isinstance(obj, np.memmap) and (state := _memmap_state(obj)) is not None:
            _, args = self._live(obj)
            return _live_memmap, (*args, state)
        if self._cupy is not None and type(obj) is self._cupy.ndarray:
            return self._reduce_cupy(obj)
        if self._core_buffer is not None and isinstance(obj, self._core_buffer):
            return self._reduce_core_buffer(obj)
        if type(obj) is contextlib._GeneratorContextManager and type(getattr(obj, "gen", None)) is types.GeneratorType:
            self.context_generators.add(id(obj.gen))  # its state follows (default reduce)
        if type(obj) is types.GeneratorType and obj.gi_suspended:
            if safepoints.instrumented(obj.gi_code) or id(obj) in self.context_generators:
                return self._live_generator(obj)
            ahead = FETCHED_AHEAD.get(f"{obj.gi_frame.f_globals.get('__name__')}.{obj.__qualname__}") if FETCHED_AHEAD else None
            if ahead:
                return self._live_generator(obj, ahead)
        if self._handle_type is not None and type(obj) is self._handle_type:
            hooks = obj.hooks_dict_ref()
            return _hook_handle, (hooks, obj.id, tuple(ref() for ref in obj.extra_dict_ref or ()))
        if UNKEPT and (unkept := _unkept_state(obj)) is not None:
            return _unkept, unkept
        if type(obj) in WEAK_MAPPINGS:
            return _weak_mapping, (type(obj), list(obj.items()))
        if type(obj) is weakref.WeakSet:
            return _weak_set, (list(obj),)
        if self._log_handler_type is not None and isinstance(obj, self._log_handler_type) and findable(type(obj)):
            return _log_handler, (type(obj), _log_handler_state(obj))
        if type(obj) in MEMORY_FILES:
            return self._reduce_by_pickle(obj)  # (a closed one has no state: live-only)
        if OVER_FILES and (over := _by_class(OVER_FILES, _over_files_of, type(obj))) is not None and (made := over(obj)):
            _, args = self._live(obj)
            return _live_over_file, args, made
        if isinstance(obj, io.IOBase) and (state := disk.reopen_state(obj)) is not None:
            _, args = self._live(obj)
            return _live_file, (*args, state)
        if isinstance(obj, self._live_types) or (LIVE_NAMES and _is_named(type(obj), LIVE_NAMES)):
            return self._live(obj)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) and findable(obj):
            return NotImplemented
        if type(obj) in (types.MethodType, types.BuiltinFunctionType, types.MethodWrapperType):
            return self._reduce_method(obj)
        if type(obj) is types.FunctionType:
            return self._live_function(obj)
        if isinstance(obj, type) and _programs(obj) and (state := roots.class_state(obj)):
            return self._live_class(obj, state)
        if isinstance(obj, type):
            return self._live(obj)
        if type(obj) in _SEQUENCE_ITERATORS:
            return _guarded(obj, obj.__reduce_ex__(PROTOCOL))
        if not findable(type(obj)):
            made = madeclasses.reduction(obj, torch)
            return self._as_built(obj, made) if made is not None else self._live_object(obj)
        try:
            reducer = copyreg.dispatch_table.get(type(obj))
            rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(PROTOCOL)
            if WHOLE_STATE and _is_named(type(obj), WHOLE_STATE) and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict):
                rv = (*rv[:2], dict(vars(obj)), *rv[3:])
            extra = _extra_state(type(obj)) if EXTRA_STATE else None
            if extra is not None and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict):
                rv = (*rv[:2], {**rv[2], **extra(obj)}, *rv[3:])
            if REPLAYED_ATTRS and isinstance(rv, tuple) and len(rv) > 2 and isinstance(rv[2], dict) and _replayed_attrs(type(obj)):
                left_out = _replayed_attrs(type(obj))
                rv = (*rv[:2], {k: v for k, v in rv[2].items() if k not in left_out}, *rv[3:])
            return self._as_built(obj, rv)
        except Exception:
            return self._live(obj)

    def _as_built(self, obj, rv):
        """``obj``'s reduction ``rv``, made safe to load, a module's with its id in the run, as a
        tensor's: `{id(m): name for name, m in model.named_modules()}`."""
        rv = _guarded(obj, rv)
        if self._torch is not None and isinstance(obj, self._torch.nn.Module) and not isinstance(rv, str):
            rv = (_with_run_id, (id(obj), rv[0], rv[1]), *rv[2:])
        return rv

    def _reduce_method(self, obj):
        """A module's own (``random.randint``, a method of its generator) by name; a method of
        a Python object as getattr(owner, name), the owner in the graph, so restore binds it to
        the owner's live counterpart (merge); a builtin as getattr(its class or module, name)
        (``torch.mean``). A builtin bound to an instance is live-only, with its owner and name
        (``LiveBuiltinMethod``): pickled whole, a copy of that instance would take its place."""
        name, owner = getattr(obj, "__name__", None), getattr(obj, "__self__", None)
        # A builtin's __module__ is None: random.random is found through its owner's class.
        for module in (getattr(obj, "__module__", None), type(owner).__module__):
            if module in sys.modules and name and getattr(sys.modules[module], name, None) == obj:
                return _module_attribute, (module, name)
        bound_to_instance = not (owner is None or isinstance(owner, (type, types.ModuleType)))
        if type(obj) in (types.BuiltinFunctionType, types.MethodWrapperType) and bound_to_instance:
            # Kept with its owner (in the graph as any object: a file as a file to open again, one
            # that cannot be kept live-only) and its name: the run may have bound another object's
            # since (`record = val_losses.append`, `write = log.write` of the log it rotated to), or
            # its owner may come back as the snapshot's (`new_id = ids.__next__` of an
            # itertools.count, which the merge adopts): the merge binds it to the owner's counterpart.
            serial, kind = self._live(obj)[1]
            return _live_builtin_method, (serial, kind, owner, name)
        if type(obj) is types.MethodType and not isinstance(owner, type) and getattr(type(owner), name, None) is not obj.__func__:
            # A function bound to an object by hand (`model.forward = types.MethodType(noisy_forward,
            # model)` at a phase change): its owner has no method of that name to get it by.
            return _guarded(obj, (_bound_method, (obj.__func__, owner)))
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
        """A local function: live-only, with its qualified name, its code's first line (the
        merge tells it from another function of the same name: the lambdas of one function) and
        its cells' contents (a closure's) as the placeholder's state, pickled after the
        placeholder is memoized, so a cell that refers back to the function is no cycle. What
        makes it again where the replay did not (a hook registered in a step the replay
        skipped) goes in ``made``: the module of its code, its defaults and attributes, the names
        a decorator gave it, which of its cells are a frame's of the snapshot ({variable: frame
        index}), each cell's id, which tells the cells it shares with other local functions, and
        the names of the modules its cells hold (`import x as y` inside the function that made it)."""
        _, args = self._live(obj)
        code = obj.__code__
        cells, frames, cell_ids, modules = {}, {}, {}, {}
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            if name == "__class__":  # zero-argument super()'s: the class, which replay defines anew
                continue
            cell_ids[name] = id(cell)
            if (at := self._frame_cells.get(id(cell))) is not None:
                frames[name] = at[0]
            try:
                cells[name] = cell.cell_contents
            except ValueError:  # a variable not bound yet
                continue
            if isinstance(cells[name], types.ModuleType):  # (live-only: made again, by its name)
                modules[name] = cells[name].__name__
        module = obj.__globals__.get("__name__")  # where its code is (a decorator's wrapper names the module it wraps)
        made = {"module": module, "frames": frames, "cell_ids": cell_ids, "modules": modules, "defaults": obj.__defaults__,
                "kwdefaults": obj.__kwdefaults__, "attrs": dict(vars(obj))}
        if (obj.__name__, obj.__qualname__, obj.__module__) != (code.co_name, code.co_qualname, module):
            made["names"] = (obj.__name__, obj.__qualname__, obj.__module__, obj.__doc__)  # (functools.wraps gave them)
        made = {key: value for key, value in made.items() if value}
        return _live_function, args, (code.co_qualname, cells, code.co_firstlineno, made)

    def _live_class(self, cls, state: dict):
        """A class of the program's defined inside a function: live-only, with its class
        attributes as the placeholder's state (restore sets them on the replay's class)."""
        _, args = self._live(cls)
        return _live_class, args, (cls.__qualname__, state)

    def _live_object(self, obj):
        """An object whose class pickle cannot name: live-only, with its ``__dict__`` and slots as
        the placeholder's state. Not what its ``__getstate__`` gives (one may refuse): restore
        merges these into the replay's object. And what makes it again of the replay's class
        (``made``): the class itself (a placeholder, which the merge finds the replay's class
        for where a frame holds it, as `Best = namedtuple(...)` in main()), a tuple's items,
        an Enum member's name."""
        _, args = self._live(obj)
        attrs = getattr(obj, "__dict__", None)
        slots = slot_values(obj)
        made = {"cls": type(obj)}
        if isinstance(obj, tuple):
            made["items"] = tuple(obj)
        if isinstance(obj, enum.Enum):
            made["member"] = obj._name_
        if not isinstance(attrs, dict) and not slots and len(made) == 1:
            return _live_only, args
        attrs = dict(attrs or {})
        if REPLAYED_ATTRS and _replayed_attrs(type(obj)):
            left_out = _replayed_attrs(type(obj))
            attrs = {k: v for k, v in attrs.items() if k not in left_out}
        return _live_object, args, (type(obj).__qualname__, attrs, slots, made)

    def _reduce_by_pickle(self, obj):
        """``obj``'s own reduction, made safe to load; live-only where it has none."""
        try:
            return _guarded(obj, obj.__reduce_ex__(PROTOCOL))
        except Exception:
            return self._live(obj)

    def _live(self, obj):
        serial = len(self.live_only)
        name = type_name(obj) if not isinstance(obj, type) else f"class {obj.__module__}.{obj.__qualname__}"
        self.live_only.append((obj, name))
        return _live_only, (serial, name)


def _memmap_state(array) -> dict | None:
    """How to map a NumPy memmap's file again: one over the whole mapping it made (not a view
    of one, nor copy-on-write, whose writes the file never sees), read-only or written in place."""
    if array.mode not in ("r", "r+", "w+") or not isinstance(array.base, mmap.mmap) or not array.filename:
        return None
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    return {"path": array.filename, "dtype": array.dtype, "offset": array.offset, "shape": array.shape, "order": order,
            "mode": array.mode}


def _log_handler_state(handler) -> dict:
    """A logging handler's attributes without its lock and open file: a FileHandler opens its file
    again at its next record, appending where it had opened it to write (the restart has put the
    file back); a stream handler on the standard streams names them."""
    import logging

    state = {k: v for k, v in vars(handler).items() if k != "lock"}
    stream = state.get("stream")
    if isinstance(handler, logging.FileHandler):
        if stream is not None:
            state["stream"] = None
            state["mode"] = state.get("mode", "a").replace("w", "a")
    elif stream is not None and stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        state["stream"] = "stdout" if stream in (sys.stdout, sys.__stdout__) else "stderr"
    return state


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


def _torch_live_types(torch) -> tuple:
    if torch is None:
        return ()
    found = []
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        found += [data.DataLoader, data.dataloader._BaseDataLoaderIter]
    found += [torch.Stream, torch.Event] if hasattr(torch, "Stream") else []
    return tuple(found)
