"""Merge: write the snapshot's state into the live, replayed objects, in place, by path.

``Merger.value(live, snap, path)`` returns what the place at ``path`` must hold afterwards:

- tensors: the snapshot's bytes copied into the live tensor (and its ``.grad``); a Parameter or
  module buffer whose shape or dtype differs is a ``StateMismatch``, never a silent rebind;
- ``nn.Module`` and other objects with a ``__dict__`` of the same type: their ``__dict__`` merged
  in place, so whatever wraps them (hooks, torch.compile, optimizers) sees restored state;
- lists, dicts (also dicts keyed by objects, such as an optimizer's per-parameter state, whose
  keys are mapped through the alignment built while merging) in place;
- numpy and CuPy arrays in place; ``random.Random``, numpy ``Generator`` and ``torch.Generator`` by state;
- a cuda.core Buffer: the snapshot's bytes copied into the live Buffer (another size is a
  ``StateMismatch``); one the replay lacks is made and filled (``restore.corebuffers``);
- a live-only placeholder keeps the live object; so does an object that could not be rebuilt,
  with what the snapshot gave it after its constructor merged in (a ``functools.partial``'s
  function, arguments and keywords; a ``defaultdict``'s entries) or a ``StateMismatch`` where
  it held more than that; where the replayed program has no object at that place (inside a
  merged object or container), that is an error: the program would meet None where it held a
  live object;
- a DTensor: this rank's shard copied into the live DTensor's local tensor (another layout is a
  ``StateMismatch``); one the replay lacks is built on its device mesh of the same layout;
- a local function keeps the live one, and what the snapshot's closure cells held is merged
  into the live function's cells, by free variable name (a function of another name there is a
  ``StateMismatch``); an object of a class pickle cannot name (defined inside a function, made at
  run time) keeps the live one, and its attributes are merged as above (another class there is
  a ``StateMismatch``);
- anything without a live counterpart of the same type waits: the same snapshot object may
  still be met at a place that has one (``best = model`` found before ``model``). ``finish``
  settles each such place with the live counterpart found meanwhile, or *adopts* the snapshot's
  object, and then points the references inside adopted objects at the live counterparts of what
  they referred to (an EMA object created mid-run keeps tracking the live model, not a copy).
  A value that ``value()`` returned must go through ``settled()`` after ``finish()``.

An object is aligned *before* its contents are merged, so cycles (argparse's actions and groups,
modules that point back at their parents) end at the first revisit, and sharing in the snapshot
stays sharing in the live program; two live tensors for one snapshot tensor means the tying
differs, which is an error naming both paths. The walk runs on an explicit stack (each merge
step is a generator that yields the child places it needs), so depth costs memory, not recursion.
"""

from __future__ import annotations

import collections
import enum
import functools
import random
import sys
import types

from gpusnap.errors import StateMismatch
from gpusnap.graph.load import (
    ADDED_BY_SETSTATE,
    CoreBuffer,
    LiveFunction,
    LiveGenerator,
    LiveObject,
    LiveOnly,
    ShardedState,
    Unbuilt,
    dtensor_layout,
)
from gpusnap.graph.walk import ATOMS as _ATOMS
from gpusnap.graph.walk import Path
from gpusnap.graph.walk import key_text as _key_text
from gpusnap.restore import corebuffers
from gpusnap.restore.frames import write_locals
from gpusnap.traverse import walk


class _Steps:
    """A merge that needs child places: the generator to drive (never a user's generator)."""

    __slots__ = ("gen",)

    def __init__(self, gen):
        self.gen = gen


class _Cell:
    """A closure cell as a one-slot container, for ``_store`` (and ``finish``'s fixups)."""

    __slots__ = ("cell",)

    def __init__(self, cell):
        self.cell = cell

    def __setitem__(self, _key, value) -> None:
        self.cell.cell_contents = value


class _Attr:
    """An object's slots as a container, for ``_store``."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __setitem__(self, name, value) -> None:
        setattr(self.obj, name, value)


class _Pending:
    """A place whose snapshot object had no live counterpart when met."""

    __slots__ = ("snap", "path")

    def __init__(self, snap, path):
        self.snap, self.path = snap, path


class Merger:
    """``write_device(address, data, host)`` copies bytes into the program's device or pinned
    memory (``stage.device.write_device_memory``, which boot hands down): cuda.core Buffers need it."""

    def __init__(self, write_device=None):
        self.write_device = write_device or _no_device_writes
        self.aligned: dict[int, object] = {}  # id(snapshot object) -> what stands for it now
        self._keep: list = []  # snapshot objects stay alive so their ids stay unique
        self._first_path: dict[int, str] = {}
        self._deferred: list = []  # (live, snap, path) of dicts whose object keys were not aligned yet
        self._adopted: list = []  # (snapshot object, path) taken as they are
        self._pending: dict[int, _Pending] = {}  # id(snapshot object) -> its waiting places
        self._fixups: list = []  # (container, key, _Pending): slots that wait for finish()
        self._building: set[int] = set()  # snapshot tuples whose items are being merged
        self._live_only: dict[int, object] = {}  # id(LiveOnly) -> the live object first placed for it
        self._state_merged: set[int] = set()  # ids of the LiveFunctions and LiveObjects merged
        self._generator_locals: list = []  # (suspended generator frame, merged locals) for finish()
        self.path: Path | str = ""  # the place being merged, for errors raised outside the merger
        self.tensors = 0
        self.nbytes = 0
        self._torch = sys.modules.get("torch")
        self._np = sys.modules.get("numpy")
        self._meshes: dict = {}  # DTensor layout (device type, ranks, names) -> the replay's device mesh

    def value(self, live, snap, path: str | Path):
        return self._drive(self._place(live, snap, Path(path) if isinstance(path, str) else path))

    def settled(self, value):
        """What a value returned by ``value()`` stands for, once ``finish()`` has run."""
        return self._settle(value) if isinstance(value, _Pending) else value

    def finish(self) -> None:
        """Merge the object-keyed dicts whose keys were not aligned when first met, settle the
        places that waited, then point adopted objects at the live counterparts of what they
        refer to."""
        self._merge_deferred()
        while self._fixups:
            fixups, self._fixups = self._fixups, []
            for container, key, pending in fixups:
                container[key] = self._settle(pending)
            self._merge_deferred()
        for pending in self._pending.values():  # root places (a frame's locals) settle here too
            self._settle(pending)
        self._remap_adopted()
        for frame, values in self._generator_locals:
            write_locals(frame, {name: self.settled(value) for name, value in values.items()})

    def _settle(self, pending: _Pending):
        found = self.aligned.get(id(pending.snap), _MISSING)
        return found if found is not _MISSING else self._adopt(pending.snap, pending.path)

    def _merge_deferred(self) -> None:
        while self._deferred:
            waiting, self._deferred = self._deferred, []
            ready = [self._live_keys(snap) is not None for _, snap, _ in waiting]
            if not any(ready):  # no key can align any more: the rest is adopted, or an error
                for live, snap, path in waiting:
                    self._drive(_Steps(self._merge_dict(live, snap, path, final=True)))
                break
            for entry, is_ready in zip(waiting, ready):
                if is_ready:
                    self._drive(_Steps(self._merge_dict(*entry)))
                else:
                    self._deferred.append(entry)

    # -- the driver ----------------------------------------------------------------------
    def _drive(self, outcome):
        if not isinstance(outcome, _Steps):
            return outcome
        stack = [outcome.gen]
        result = None
        while stack:
            try:
                request = stack[-1].send(result)
            except StopIteration as done:
                stack.pop()
                result = done.value
                continue
            outcome = self._place(*request)
            if isinstance(outcome, _Steps):
                stack.append(outcome.gen)
                result = None
            else:
                result = outcome
        return result

    def _align(self, snap, result, path: Path):
        self.aligned[id(snap)] = result
        self._keep.append(snap)
        self._first_path[id(snap)] = path
        return result

    # -- one place -----------------------------------------------------------------------
    def _place(self, live, snap, path: Path):
        self.path = path
        if isinstance(snap, _ATOMS):
            return snap
        if isinstance(snap, (LiveOnly, Unbuilt)):
            if live is None:
                # The same object at several places in the snapshot (one weakref, listed once per
                # epoch by a framework): where the replay has none, the one placed first stands.
                live = self._live_only.get(id(snap))
            elif isinstance(snap, LiveOnly):
                self._live_only.setdefault(id(snap), live)
            if live is None and (isinstance(snap, Unbuilt) or path.depth > 1):
                # The program would meet None where it held a live object (a DataLoader iterator
                # inside a framework's fetcher): it cannot continue from this state.
                why = f"cannot be rebuilt here ({snap.error})" if isinstance(snap, Unbuilt) else "is not captured (live-only)"
                raise StateMismatch(f"{path}: the snapshot's {snap.type_name} {why}, and the replayed program has nothing at this place")
            if isinstance(snap, Unbuilt) and live is not None and id(snap) not in self._state_merged:
                self._state_merged.add(id(snap))
                return _Steps(self._merge_unbuilt(live, snap, path))
            if isinstance(snap, (LiveFunction, LiveObject, LiveGenerator)) and live is not None and id(snap) not in self._state_merged:
                self._state_merged.add(id(snap))
                if isinstance(snap, LiveFunction):
                    return _Steps(self._merge_cells(live, snap, path))
                if isinstance(snap, LiveGenerator):
                    return _Steps(self._merge_generator(live, snap, path))
                if type(live).__qualname__ != snap.qualname:
                    raise StateMismatch(f"{path}: the snapshot holds a {snap.qualname} here, the replayed program a {type(live).__qualname__}")
                return _Steps(self._merge_attrs(live, snap.attrs, path, snap.slots))
            return live
        torch = self._torch
        done = self.aligned.get(id(snap), _MISSING)
        if done is not _MISSING:
            if torch is not None and isinstance(snap, torch.Tensor) and isinstance(live, torch.nn.Parameter) and live is not done:
                raise StateMismatch(
                    f"tying differs at {path}: in the snapshot it is the same tensor as {self._first_path[id(snap)]}"
                )
            return done
        if id(snap) in self._building:
            return snap  # a tuple reached through its own items: the one place it cannot be rebuilt
        if isinstance(snap, ShardedState):
            if live is None or not hasattr(live, "_local_tensor"):
                return self._wait(snap, path)
            return self._align(snap, self._merge_sharded(live, snap, path), path)
        if isinstance(snap, CoreBuffer):
            if not corebuffers.is_buffer(live):
                return self._wait(snap, path)
            self.nbytes += snap.nbytes
            return self._align(snap, corebuffers.merge_into(live, snap, path, self.write_device), path)
        if torch is not None and isinstance(snap, torch.Tensor):
            if not isinstance(live, torch.Tensor):
                return self._wait(snap, path)
            return self._align(snap, self._merge_tensor(live, snap, path), path)
        if live is None or type(live) is not type(snap):
            return self._wait(snap, path)
        if isinstance(snap, list):
            self._align(snap, live, path)
            return _Steps(self._merge_list(live, snap, path))
        if isinstance(snap, dict):
            self._align(snap, live, path)
            return _Steps(self._merge_dict(live, snap, path))
        if isinstance(snap, tuple):
            self._building.add(id(snap))
            return _Steps(self._merge_tuple(live, snap, path))
        if self._merge_by_state(live, snap):
            return self._align(snap, live, path)
        if hasattr(snap, "__dict__") and isinstance(getattr(live, "__dict__", None), dict):
            self._align(snap, live, path)
            return _Steps(self._merge_attrs(live, snap.__dict__, path, added=ADDED_BY_SETSTATE.get(id(snap), ())))
        return self._adopt(snap, path)

    def _wait(self, snap, path: Path) -> _Pending:
        pending = self._pending.get(id(snap))
        if pending is None:
            pending = self._pending[id(snap)] = _Pending(snap, path)
        return pending

    def _store(self, container, key, value) -> None:
        container[key] = value
        if isinstance(value, _Pending):
            self._fixups.append((container, key, value))

    def _adopt(self, snap, path: Path):
        if isinstance(snap, ShardedState):
            return self._align(snap, self._built_dtensor(snap, path), path)
        if isinstance(snap, CoreBuffer):
            self.nbytes += snap.nbytes
            return self._align(snap, corebuffers.build(snap, path, self.write_device), path)
        self._adopted.append((snap, path))
        return self._align(snap, snap, path)

    def _merge_by_state(self, live, snap) -> bool:
        """Arrays and random generators: the live object takes the snapshot's state."""
        np, torch = self._np, self._torch
        if np is not None and isinstance(snap, np.ndarray):
            if live.shape == snap.shape and live.dtype == snap.dtype and live.flags.writeable:
                live[...] = snap
                return True
            return False
        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(snap, cupy.ndarray):
            if live.shape == snap.shape and live.dtype == snap.dtype:
                live[...] = snap  # on the live array's device
                self.nbytes += snap.nbytes
                return True
            return False
        if isinstance(snap, random.Random):
            live.setstate(snap.getstate())
        elif np is not None and isinstance(snap, np.random.Generator):
            live.bit_generator.state = snap.bit_generator.state
        elif torch is not None and isinstance(snap, torch.Generator):
            live.set_state(snap.get_state())
        else:
            return False
        return True

    # -- tensors -------------------------------------------------------------------------
    def _merge_tensor(self, live, snap, path: Path):
        torch = self._torch
        if live.shape != snap.shape or live.dtype != snap.dtype:
            if isinstance(live, torch.nn.Parameter) or any(s in ("._buffers", ".state") for s in path.suffixes()):
                raise StateMismatch(
                    f"{path}: the snapshot holds {tuple(snap.shape)} {snap.dtype}, "
                    f"the program built {tuple(live.shape)} {live.dtype}"
                )
            return snap
        with torch.no_grad():
            live.copy_(snap)
            if snap.grad is None:
                live.grad = None
            elif live.grad is not None and live.grad.shape == snap.grad.shape:
                live.grad.copy_(snap.grad)
            else:
                live.grad = snap.grad.to(live.device)
        self.tensors += 1
        self.nbytes += snap.numel() * snap.element_size()
        return live

    # -- DTensors: this rank's shard ------------------------------------------------------
    def _merge_sharded(self, live, snap: ShardedState, path: Path):
        layout = dtensor_layout(live)
        if layout != snap.layout or tuple(live.shape) != snap.shape:
            raise StateMismatch(f"{path}: the snapshot holds a DTensor {snap.shape} sharded as {snap.layout}, the program "
                                f"built {tuple(live.shape)} sharded as {layout}")
        self._meshes[layout[:3]] = live._spec.mesh
        local = live._local_tensor
        if local.shape != snap.local.shape or local.dtype != snap.local.dtype:
            raise StateMismatch(f"{path}: this rank's shard is {tuple(snap.local.shape)} {snap.local.dtype} in the snapshot, "
                                f"{tuple(local.shape)} {local.dtype} in the program")
        torch = self._torch
        with torch.no_grad():
            local.copy_(snap.local)
            live.grad = None if snap.grad is None else self._built_dtensor(snap.grad, path + ".grad")
        self.tensors += 1
        self.nbytes += snap.local.numel() * snap.local.element_size()
        return live

    def _built_dtensor(self, snap: ShardedState, path: Path):
        """A DTensor made from the snapshot's shard, on the replay's device mesh of its layout
        (optimizer state made after the replay's point: AdamW's moments of FSDP2 parameters)."""
        mesh = self._meshes.get(snap.layout[:3])
        if mesh is None:
            raise StateMismatch(f"{path}: the snapshot holds a DTensor on device mesh {snap.layout[1]}, and the replayed "
                                "program has no DTensor on such a mesh")
        from torch.distributed.tensor import DTensor

        local = snap.local.to(mesh.device_type) if snap.local.device.type != mesh.device_type else snap.local
        built = DTensor.from_local(local, mesh, snap.placements, run_check=False, shape=self._torch.Size(snap.shape),
                                   stride=snap.stride)
        if snap.is_param:
            built = self._torch.nn.Parameter(built, requires_grad=snap.requires_grad)
        self.tensors += 1
        self.nbytes += snap.local.numel() * snap.local.element_size()
        return built

    # -- containers: generators that yield (live child, snapshot child, path) ------------
    def _merge_list(self, live: list, snap: list, path: Path):
        merged = []
        for i, item in enumerate(snap):
            merged.append((yield (live[i] if i < len(live) else None, item, path + f"[{i}]")))
        live[:] = [None] * len(merged)
        for i, value in enumerate(merged):
            self._store(live, i, value)
        return live

    def _merge_tuple(self, live: tuple, snap: tuple, path: Path):
        merged = []
        for i, item in enumerate(snap):
            value = yield (live[i] if i < len(live) else None, item, path + f"[{i}]")
            merged.append(self.settled(value))  # an immutable tuple cannot wait for finish()
        self._building.discard(id(snap))
        if len(merged) == len(live) and all(a is b for a, b in zip(merged, live)):
            result = live
        elif type(snap) is tuple:
            result = tuple(merged)
        elif hasattr(type(snap), "_make"):  # a namedtuple
            result = type(snap)._make(merged)
        else:
            result = snap
        return self._align(snap, result, path)

    def _merge_dict(self, live: dict, snap: dict, path: Path, final: bool = False):
        keys = self._live_keys(snap, final, path)
        if keys is None:
            self._deferred.append((live, snap, path))
            return live
        merged = []
        for live_key, (key, value) in zip(keys, snap.items()):
            merged.append((live_key, (yield (live.get(live_key), value, path + f"[{_key_text(key)}]"))))
        live.clear()
        for key, value in merged:
            self._store(live, key, value)
        return live

    def _live_keys(self, snap: dict, final: bool = False, path: Path = "") -> list | None:
        """The live key for each snapshot key, or None while an object key is not aligned."""
        keys = []
        torch = self._torch
        for key in snap:
            if _plain_key(key):
                keys.append(key)
            elif id(key) in self.aligned:
                keys.append(self.aligned[id(key)])
            elif not final:
                return None
            elif torch is not None and isinstance(key, torch.Tensor):
                raise StateMismatch(f"{path}: a key of this dict ({type(key).__name__}) has no counterpart in the program")
            else:
                keys.append(self._adopt(key, path + f"[<key {type(key).__name__}>]"))
        return keys

    def _merge_attrs(self, live, snap_attrs: dict, path: Path, snap_slots: dict | None = None, added=()):
        live_attrs = live.__dict__ if snap_attrs else {}
        # Object-keyed dicts (optimizer.state) come last: their keys align while the rest merges.
        for name in sorted(snap_attrs, key=lambda k: _has_object_keys(snap_attrs[k])):
            value = snap_attrs[name]
            if isinstance(value, LiveOnly) and name not in live_attrs:
                continue  # nothing to keep, and nothing the snapshot could give
            if name in added and name in live_attrs and not _picklable(value):
                # Not saved: the class's __setstate__ made it for the loaded copy (DDP's reducer,
                # hooked to the copy's parameters). The live object keeps its own.
                continue
            self._store(live_attrs, name, (yield (live_attrs.get(name), value, path + f".{name}")))
        for name, value in (snap_slots or {}).items():
            self._store(_Attr(live), name, (yield (getattr(live, name, None), value, path + f".{name}")))
        # Attributes the snapshot lacks stay: a class whose __getstate__ leaves some out
        # (torch's optimizers keep only defaults, state and param_groups) rebuilds them itself.
        return live

    def _merge_generator(self, live, snap: LiveGenerator, path: Path):
        """A generator the replay ran to the saved place (livecheck) takes the snapshot's locals;
        one it did not run keeps its own (livecheck has refused unless it matched already)."""
        if type(live) is not types.GeneratorType or not live.gi_suspended or live.gi_code.co_qualname != snap.qualname:
            return live
        current = live.gi_frame.f_locals
        merged = {}
        for name, value in snap.locals.items():
            merged[name] = yield (current.get(name), value, path + f".gi_frame.f_locals[{name!r}]")
        self._generator_locals.append((live.gi_frame, merged))
        return live

    def _merge_cells(self, live, snap: LiveFunction, path: Path):
        code = getattr(live, "__code__", None)
        if type(live) is not types.FunctionType or code.co_qualname != snap.qualname:
            found = code.co_qualname if type(live) is types.FunctionType else type(live).__name__
            raise StateMismatch(f"{path}: the snapshot holds function {snap.qualname} here, the replayed program {found}")
        cells = {name: (i, cell) for i, (name, cell) in enumerate(zip(code.co_freevars, live.__closure__ or ()))}
        for name, value in snap.cells.items():
            if name not in cells:
                raise StateMismatch(f"{path}: the replayed {snap.qualname} has no variable {name} in its closure")
            i, cell = cells[name]
            try:
                current = cell.cell_contents
            except ValueError:  # not bound in the replay yet
                current = None
            self._store(_Cell(cell), None, (yield (current, value, path + f".__closure__[{i}].cell_contents")))
        return live

    def _merge_unbuilt(self, live, snap: Unbuilt, path: Path):
        """An object that could not be rebuilt here because its constructor met a live-only
        argument: what the snapshot gave it afterwards goes into the replayed object. Dropping
        that would restart with the replay's state and say nothing (the counts of a
        ``defaultdict(lambda: 0)``, the cells of a closure behind a ``functools.partial``)."""
        if type(live) is functools.partial and isinstance(snap.state, tuple) and len(snap.state) == 4:
            merged = yield (live.__reduce__()[2], snap.state, path)
            live.__setstate__(self.settled(merged))  # its function (cells merged), arguments, keywords
            return live
        if isinstance(live, collections.defaultdict) and snap.state is None and not snap.items:
            return (yield from self._merge_dict(live, snap.entries, path))  # the factory stays the replay's
        if snap.holds_anything():
            raise StateMismatch(
                f"{path}: the snapshot's {snap.type_name} cannot be rebuilt here ({snap.error}), and gpusnap "
                f"cannot put what it held into the replayed {type(live).__qualname__}")
        return live

    # -- adopted objects -----------------------------------------------------------------
    def _remap_adopted(self) -> None:
        """Inside what was adopted, replace snapshot objects by what stands for them now."""
        met: list = []  # what resolving one object adopted: looked into next
        resolve = self._resolver(met)

        def expand(obj, path: Path):
            adopted = met[:]
            met.clear()
            return adopted

        for obj, path in walk(self._adopted, expand):
            self.path = path
            if type(obj) is list:
                obj[:] = [resolve(item, path + f"[{i}]") for i, item in enumerate(obj)]
            elif type(obj) is dict:
                items = [(resolve(k, path), resolve(v, path + f"[{_key_text(k)}]")) for k, v in obj.items()]
                obj.clear()
                obj.update(items)
            elif isinstance(getattr(obj, "__dict__", None), dict) and not self._is_tensor(obj):
                attrs = obj.__dict__
                for name, value in list(attrs.items()):
                    attrs[name] = resolve(value, path + f".{name}")

    def _resolver(self, todo: list):
        def resolve(item, path: Path):
            if isinstance(item, _ATOMS) or isinstance(item, (LiveOnly, type)):
                return item
            if id(item) in self.aligned:
                return self.aligned[id(item)]
            # A bound method or partial made during training (Lightning's logged-metric metadata
            # holds strategy.reduce) must call the live object, not the snapshot's copy of it.
            if type(item) is types.MethodType:
                owner = resolve(item.__self__, path + ".__self__")
                return item if owner is item.__self__ else types.MethodType(item.__func__, owner)
            if type(item) is functools.partial:
                func = resolve(item.func, path + ".func")
                args = tuple(resolve(a, path + f".args[{i}]") for i, a in enumerate(item.args))
                kwargs = {k: resolve(v, path + f".keywords[{k!r}]") for k, v in item.keywords.items()}
                if func is item.func and all(a is b for a, b in zip(args, item.args)) and kwargs == item.keywords:
                    return item
                return functools.partial(func, *args, **kwargs)
            if type(item) is tuple:
                rebuilt = tuple(resolve(x, path + f"[{i}]") for i, x in enumerate(item))
                return item if all(a is b for a, b in zip(rebuilt, item)) else rebuilt
            todo.append((item, path))
            return self._adopt(item, path)

        return resolve

    def _is_tensor(self, obj) -> bool:
        return self._torch is not None and isinstance(obj, self._torch.Tensor)


_MISSING = object()


def _no_device_writes(address: int, data, host: bool = False) -> None:
    raise StateMismatch("the snapshot holds a cuda.core Buffer, and this restore writes no device memory",
                        hint="restart with gpusnap, which restores device memory")


def _plain_key(key) -> bool:
    """A key that means the same in any process: atoms, classes, enum members, and tuples or
    frozensets of those."""
    todo = [key]
    while todo:
        item = todo.pop()
        if isinstance(item, (tuple, frozenset)):
            todo.extend(item)
        elif not isinstance(item, _ATOMS + (type, enum.Enum)):
            return False
    return True


def _has_object_keys(value) -> bool:
    return isinstance(value, dict) and any(not _plain_key(k) for k in value)


def _picklable(value) -> bool:
    """Can pickle reduce ``value`` (the C++ objects torch binds without pickle support cannot)?"""
    try:
        value.__reduce_ex__(5)
    except Exception:  # noqa: BLE001 - whatever it raises, it is no data the snapshot holds
        return False
    return True
