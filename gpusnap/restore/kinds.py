"""Merge, kind by kind: how the snapshot's state goes into a live object of each kind (tensors,
DTensors, arrays and random generators by state, lists, tuples, dicts, objects' attributes, a
suspended generator's locals, a closure's cells, what an unbuildable object was given). The
driver (``merge.Merger``: alignment, waiting places, adoption) decides which applies where.

``KindMerges`` is a part of ``merge.Merger`` and works on its state. A merge that needs child
places is a generator: it yields ``(live child, snapshot child, path)`` and receives what the
place holds afterwards, so depth costs memory, not recursion."""

from __future__ import annotations

import array
import bisect
import collections
import contextlib
import enum
import functools
import random
import sys
import types
import weakref

from gpusnap.errors import StateMismatch
from gpusnap.graph.load import (
    GRAD_HOOKS,
    MEMORY_FILES,
    RUN_IDS,
    HookHandle,
    LiveClass,
    LiveFile,
    LiveFunction,
    LiveGenerator,
    LiveObject,
    LiveOnly,
    LiveOverFile,
    ShardedState,
    Unbuilt,
    _ndarray_over,
    array_base,
    flat_bytes,
    dtensor_layout,
    grad_hooks,
)
from gpusnap.graph.walk import ATOMS as _ATOMS
from gpusnap.graph.walk import Path
from gpusnap.graph.walk import key_text as _key_text
from gpusnap.rawmem import strided_extent


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


class _HandleDicts:
    """A torch hook handle's dicts as a container, for ``_store``: the handle holds each by a weak
    reference, set when the dict's live counterpart is known (``finish``, where it waited)."""

    __slots__ = ("handle", "refs")

    def __init__(self, handle, count: int):
        self.handle, self.refs = handle, [_dead_ref()] * count

    def __setitem__(self, i, value) -> None:
        self.refs[i] = weakref.ref(value) if isinstance(value, dict) else _dead_ref()
        self.handle.hooks_dict_ref = self.refs[0]
        self.handle.extra_dict_ref = tuple(self.refs[1:])


class _PartialParts:
    """A ``functools.partial``'s function, arguments and keywords as a container, for ``_store``:
    set in place through its ``__setstate__`` once each part is what stands for the run's (a
    part that waits for ``finish`` is no function, tuple or dict yet)."""

    __slots__ = ("partial", "parts")

    def __init__(self, partial):
        self.partial, self.parts = partial, {"func": partial.func, "args": partial.args, "keywords": partial.keywords}

    def __setitem__(self, name, value) -> None:
        self.parts[name] = value
        func, args, keywords = self.parts["func"], self.parts["args"], self.parts["keywords"]
        if callable(func) and type(args) is tuple and type(keywords) is dict:
            self.partial.__setstate__((func, args, keywords, self.partial.__dict__ or None))


def _dead_ref():
    return weakref.ref(collections.OrderedDict())  # what torch's own __setstate__ gives a handle whose dict was gone


def _written_through(torch, live, snap):
    """What of ``live`` takes ``snap``'s bytes: ``live`` itself, or, where its elements share
    memory along broadcast dimensions (``torch.arange(T).expand(B, T)`` kept in setup, stride 0),
    a view with each such dimension cut to one element, which a copy into the whole refuses
    ("more than one element of the written-to tensor refers to a single memory location"; the
    merge failed). None where it shares memory otherwise (an ``unfold``'s windows), or where
    the run's tensor did not broadcast alike: no copy in place can give it the run's values."""
    if live.layout is not torch.strided or live.is_nested or not torch._debug_has_internal_overlap(live):
        return live  # (a sparse tensor "overlaps": its values are copied whole)
    if snap.layout is not torch.strided or live.stride() != snap.stride():
        return None
    shape = tuple(1 if stride == 0 else size for size, stride in zip(live.shape, live.stride()))
    cut = live.as_strided(shape, live.stride(), live.storage_offset())
    return cut if not torch._debug_has_internal_overlap(cut) else None


def _native_state(obj):
    """The state of an object of a compiled class that keeps it beyond its ``__dict__``, which
    the class's own ``__setstate__`` (a compiled one) sets from plain data: a tokenizers
    ``Tokenizer``, whose vocabulary, added tokens and truncation are Rust's, serialized to JSON.
    Its ``__dict__`` is empty: merged as attributes, the replay's tokenizer stood as the setup
    made it, without the tokens the run added and the truncation it turned on at a phase
    change, and the restart was refused (corpus/tokenizer_grow.py, 4 of 4). None for any
    other object, and where the state holds objects (a ``functools.partial``'s function and
    arguments), which have counterparts of their own."""
    setstate = getattr(type(obj), "__setstate__", None)
    if not isinstance(setstate, (types.MethodDescriptorType, types.WrapperDescriptorType)) or not hasattr(obj, "__dict__"):
        return None
    try:
        reduced = obj.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - not picklable this way: not this kind
        return None
    state = reduced[2] if isinstance(reduced, tuple) and len(reduced) > 2 else None
    return state if state is not None and _plain(state) else None


def _plain(value) -> bool:
    if isinstance(value, (bytes, str, int, float, bool, type(None))):
        return True
    if type(value) in (tuple, list):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


class KindMerges:
    def _merge_by_state(self, live, snap) -> bool:
        """Arrays (NumPy's, bytearrays, array.array), random generators, in-memory files and
        objects of compiled classes that set their own state (``_native_state``): the live object
        takes the snapshot's state (a csv.writer the replay made over its StringIO writes on into
        the run's report)."""
        if type(snap) in MEMORY_FILES:
            live.seek(0)
            live.truncate()
            live.write(snap.getvalue())
            live.seek(snap.tell())
            return True
        if type(snap) in (bytearray, array.array) and (type(snap) is bytearray or live.typecode == snap.typecode):
            # In place: a memoryview the replay made over it (a ring buffer written through the
            # view) saw setup's bytes when the snapshot's was adopted. One the view pins to its
            # length takes the snapshot's only where the length is the run's.
            try:
                live[:] = snap
            except BufferError:
                return False
            return True
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
        elif np is not None and isinstance(snap, np.random.RandomState):
            # in place, as the others: the legacy generator was adopted whole, and what the replay
            # bound to its own (`draw = rng.rand`, a partial of `rng.normal`) drew from setup's state
            live.set_state(snap.get_state())
        elif np is not None and isinstance(snap, np.random.BitGenerator):
            live.state = snap.state
        elif torch is not None and isinstance(snap, torch.Generator):
            live.set_state(snap.get_state())
        elif (state := _native_state(snap)) is not None:
            live.__setstate__(state)
            return not snap.__dict__  # what the program set on it besides: merged as attributes
        else:
            return False
        return True

    # -- tensors -------------------------------------------------------------------------
    def _merge_tensor(self, live, snap, path: Path):
        torch = self._torch
        self._same_grad_hooks(live, snap, path)
        lazy = isinstance(live, torch.nn.parameter.UninitializedTensorMixin)
        if lazy and isinstance(snap, torch.nn.parameter.UninitializedTensorMixin):
            return live  # neither has memory yet
        if live.layout != torch.strided or snap.layout != torch.strided:
            return self._merge_sparse(live, snap, path)
        # A lazy module's parameter that the run materialized in its first forward (the replay
        # skipped it) has no shape to compare: it takes the snapshot's, and becomes what
        # materializing makes it (a Parameter, or a plain tensor for a buffer).
        reshaped = lazy or live.shape != snap.shape or live.dtype != snap.dtype
        into = live if reshaped else _written_through(torch, live, snap)
        if into is None:
            return snap  # memory the place's elements share otherwise than the run's did: the snapshot's
        if reshaped:
            if not _held_in_place(torch, live, path):
                return snap  # a plain tensor: the place takes the snapshot's
            if not self._takes_shape(live, snap):
                built = "a lazy module's uninitialized tensor" if lazy else f"{tuple(live.shape)} {live.dtype}"
                raise StateMismatch(f"{path}: the snapshot holds {tuple(snap.shape)} {snap.dtype}, the program built {built}")
        with torch.no_grad():
            if reshaped:
                if lazy:
                    live.__class__ = live.cls_to_become
                live.data = snap  # the same object (optimizers and hooks hold it), the snapshot's memory
                self.reshaped += 1
            else:
                # One the replay made under torch.inference_mode() (a baseline evaluated in
                # setup) takes bytes in that mode only: in place, outside it, the merge failed
                # and the restart was refused (corpus/inference_baseline.py, 3 of 3).
                with torch.inference_mode() if live.is_inference() else contextlib.nullcontext():
                    self._part_if_apart(live, snap)
                    into.copy_(snap if into is live else snap.as_strided(into.shape, snap.stride(), snap.storage_offset()))
            _set_requires_grad(live, snap.requires_grad)
            if snap.grad is None:
                live.grad = None
            elif live.grad is not None and live.grad.shape == snap.grad.shape:
                live.grad.copy_(snap.grad)
            else:
                live.grad = snap.grad.to(live.device)
        self.tensors += 1
        self.nbytes += snap.numel() * snap.element_size()
        return live

    def _merge_sparse(self, live, snap, path: Path):
        """A sparse tensor (a graph's normalized adjacency, built in setup, as GCN scripts do):
        its indices and values have no storage to write through, and the merge failed ("Cannot
        access storage of SparseTensorImpl", refused). The live tensor takes the snapshot's in
        place (whatever holds it, a module or a closure, keeps it): a COO tensor by ``.data``, a
        compressed one (CSR, CSC) by ``copy_``, which torch allows between tensors of as many
        elements (``.data`` leaves one as it was). Otherwise a plain tensor's place takes the
        snapshot's, and a parameter's or a buffer's refuses."""
        torch = self._torch
        kept = _held_in_place(torch, live, path)
        same = live.layout == snap.layout and live.shape == snap.shape and live.dtype == snap.dtype
        if not same or (live.layout != torch.sparse_coo and live._nnz() != snap._nnz()):
            if kept:
                raise StateMismatch(f"{path}: the snapshot holds a {snap.layout} tensor {tuple(snap.shape)} {snap.dtype}, "
                                    f"the program built a {live.layout} one {tuple(live.shape)} {live.dtype}")
            return snap
        with torch.no_grad():
            if live.layout == torch.sparse_coo:
                live.data = snap.to(live.device)
            else:
                live.copy_(snap)
            _set_requires_grad(live, snap.requires_grad)
            live.grad = None if snap.grad is None else snap.grad.to(live.device)
        self.tensors += 1
        return live

    def _same_grad_hooks(self, live, snap, path: Path) -> None:
        """The run's gradient hooks on a leaf tensor (code the program registered on it) where the
        replay's tensor has another number of them: registered in a step the replay skips (`p.
        register_hook(lambda g: g.clamp(...))` at a phase change), they were missing after the
        restart, which the witness refused without naming them, or, where they act only later,
        did not see. The snapshot's dicts of them go onto the live tensor at finish (their hooks
        the replay's functions, or made again: restore.functions); where the run had none left
        (it removed them), the replay's go. A stream that only counted them refuses, naming the
        tensor."""
        want = GRAD_HOOKS.get(id(snap))
        if want is None:
            return  # (a stream written before hooks were counted)
        dicts = want if isinstance(want, tuple) else None
        count = sum(len(d or ()) for d in dicts) if dicts is not None else want
        have = grad_hooks(live) if live is not snap else 0
        if count == have:
            return
        if count == 0:
            for hooks in (live._backward_hooks, getattr(live, "_post_accumulate_grad_hooks", None)):
                if hooks:
                    hooks.clear()
            return
        if dicts is not None:
            self._grad_hooks_later.append((live, dicts))
            self._adopted.extend((d, path + ".hooks") for d in dicts if d)  # their hooks resolved with the adopted
            return
        raise StateMismatch(
            f"{path}: the run's tensor had {want} gradient hook{'s' if want != 1 else ''} (register_hook), the replay's "
            f"{have}; hooks registered in a step the replay skips are not in the snapshot (they are code)",
            hint="register the hooks where the replay runs them again (the script's setup, or the start of each epoch), "
                 "or restart from a snapshot taken before they were registered (gpusnap restart DIR --snapshot ID)",
        )

    def _put_grad_hooks(self) -> None:
        """The run's hook dicts onto the tensors ``_same_grad_hooks`` found without them: the live
        dict the merge gave one of them (a handle the program keeps holds it), else the
        snapshot's. Assigned, not filled: torch registers a dict with autograd when it is set."""
        for live, dicts in self._grad_hooks_later:
            for name, hooks in zip(("_backward_hooks", "_post_accumulate_grad_hooks"), dicts):
                if hooks:
                    setattr(live, name, self.aligned.get(id(hooks), hooks))
                elif getattr(live, name, None):
                    getattr(live, name).clear()

    def _takes_shape(self, live, snap) -> bool:
        """Whether a parameter or buffer may take the snapshot's shape and dtype in place. The
        run's steps change them where the replay, which skips the steps, does not: fake-quantize
        and per-channel observers resize their buffers at their first forward, `param.data = `
        and `module.half()` swap what a parameter holds. Host tensors of the snapshot's own
        source only: a forced, changed source may have built the place otherwise (refused, with
        the path), and a device tensor's memory is placed by the device restore."""
        torch = self._torch
        return (self.same_sources and live.device.type == "cpu" and snap.device.type == "cpu"
                and live.layout == torch.strided and snap.layout == torch.strided)

    def _part_if_apart(self, live, snap) -> None:
        """Move a live tensor to memory of its own where the replay made it share memory with
        another merged place that the run held apart: `params = {k: v.detach() ...}` in setup
        shares the parameters' memory, and the run's steps rebound it (functional training,
        torch.func). Copying the snapshot's bytes into both wrote one over the other. The first
        tensor merged into a live storage keeps it; a later one whose snapshot tensor lies in
        another snapshot storage moves, with the others of that storage, to one copy of it at the
        same offsets: sharing the run had (views of one tensor) stays shared. Host tensors only:
        a device snapshot's views can be loaded as storages of their own."""
        if live.device.type != "cpu" or snap.device.type != "cpu":
            return
        storage = live.untyped_storage()
        if storage.nbytes() == 0:
            return
        theirs = snap.untyped_storage().data_ptr()
        owner = self._storage_owner.setdefault(storage.data_ptr(), theirs)  # live storage -> snapshot storage
        if owner == theirs:
            return
        moved = self._storage_moved.get((storage.data_ptr(), theirs))
        if moved is None:
            moved = self._storage_moved[(storage.data_ptr(), theirs)] = storage.clone()
            self._storage_owner[moved.data_ptr()] = theirs
            self.parted += 1
        live.set_(moved, live.storage_offset(), live.size(), live.stride())

    def _shared_storages(self) -> list[tuple[object, list]]:
        """[(the live storage that stands for one snapshot storage, or None; its places: [(snapshot
        tensor, live tensor), ...]), ...] over the host tensors merged or adopted. Of the places,
        the live one that holds a storage of the snapshot's size at the snapshot's offset owns
        it: a parameter first, and the snapshot's own tensor (adopted) last."""
        torch = self._torch
        groups: dict[int, list] = {}
        for snap in self._keep:
            placed = self.aligned.get(id(snap))
            theirs = _host_storage(torch, snap)
            if theirs is not None and _host_storage(torch, placed) is not None:
                groups.setdefault(theirs, []).append((snap, placed))

        def fits(pair):
            snap, placed = pair
            return (placed.untyped_storage().nbytes() == snap.untyped_storage().nbytes()
                    and placed.storage_offset() * placed.element_size() == snap.storage_offset() * snap.element_size())

        out = []
        for places in groups.values():
            owners = sorted((pair for pair in places if fits(pair)),
                            key=lambda pair: (pair[1] is pair[0], not isinstance(pair[1], torch.nn.Parameter)))
            out.append((owners[0][1].untyped_storage() if owners else None, places))
        return out

    def _join_shared(self) -> None:
        """Make the tensors that shared one storage in the snapshot share one again. The replay
        can hold them apart: `best_state = model.state_dict()` (no copy) in a step shares the
        parameters' memory, where the replay's setup left a deep copy, or nothing, and the
        snapshot's tensor was adopted. Merged or adopted apart, the parameters' later steps no
        longer reach the best state, and `model.load_state_dict(best_state)` loaded stale
        weights. The others move onto the storage that owns them (``_shared_storages``) at their
        offsets (``set_``: identity and views stay). Where none owns one, all of them move onto a
        copy of the snapshot's: parameters the run had put in one flat buffer (a periodic model
        averager sets each `p.data` to a view of the averaged flat tensor) were apart after a
        restart, and the witness refused it. Host tensors only, as ``_part_if_apart``."""
        torch = self._torch
        if torch is None:
            return
        for storage, places in self._shared_storages():
            if len({placed.untyped_storage().data_ptr() for _, placed in places}) < 2:
                continue  # shared already, or one place
            if storage is None:
                storage = places[0][0].untyped_storage().clone()
            with torch.no_grad():
                for snap, placed in places:
                    if placed.untyped_storage().data_ptr() == storage.data_ptr() or placed.dtype != snap.dtype:
                        continue
                    offset = snap.storage_offset()
                    placed.new_empty(0).set_(storage, offset, snap.size(), snap.stride()).copy_(placed)
                    placed.set_(storage, offset, snap.size(), snap.stride())
                    self.joined += 1

    def _note_live_array(self, snap, live) -> None:
        """An array of the snapshot merged into a live one: a view of it the replay holds none of
        comes back over the live one (``_ndarray_over_live``), and so does a tensor over its
        memory (``_onto_live_arrays``). The spans stay apart: a view within an array noted
        already is not noted, and one noted before its array goes when the array comes. A view
        noted beside its array (`head = flat[:4]` over the live `flat`) began where the array
        did, and the lookup met the view's shorter span and found no array under a tensor over
        all of `flat`."""
        if not (snap.flags.c_contiguous and snap.nbytes):
            return
        start = snap.__array_interface__["data"][0]
        end = start + snap.nbytes
        spans = self._live_arrays
        i = bisect.bisect_left(spans, start, key=lambda span: span[0])
        if (i and end <= spans[i - 1][1]) or (i < len(spans) and spans[i][0] == start and end <= spans[i][1]):
            return
        j = i
        while j < len(spans) and spans[j][1] <= end:
            j += 1
        spans[i:j] = [(start, end, snap, live)]

    def _ndarray_over_live(self, snap):
        """A NumPy array the run made over a tensor's memory (`decay = w.detach().numpy()`) or over
        another array's (`recent = ring[8:]`), and the replay holds none of: the same view over
        the live storage that stands for that tensor's, or over the live array the merge aligned
        with that array; None where none does (it viewed what the merge adopts: it keeps that).
        As the snapshot's array, it viewed a copy that no training moves: the program's writes
        through it (a decay by hand) reached no weight, and its reads (the spread of the recent
        losses) saw none of the losses written after the restart: "verified", other bytes."""
        torch = self._torch
        address = snap.__array_interface__["data"][0]
        lowest, nbytes = strided_extent(address, snap.shape, snap.strides, snap.itemsize)
        span = self._merged_array_holding(lowest, nbytes)  # an array merged into a live one, whose memory holds this one
        if span is not None:
            start, live = span
            return _ndarray_over(live, address - start, snap.dtype.str, snap.shape, snap.strides)
        _, base = array_base(snap)
        theirs = _host_storage(torch, base) if torch is not None else None
        if theirs is None:
            return None
        storage = next((storage for storage, places in self._shared_storages()
                        if storage is not None and _host_storage(torch, places[0][0]) == theirs), None)
        if storage is None or storage.data_ptr() == theirs:
            return None
        return _ndarray_over(storage, address - theirs, snap.dtype.str, snap.shape, snap.strides)

    def _merged_array_holding(self, lowest: int, nbytes: int):
        """(the start of the snapshot's array whose memory holds ``nbytes`` from ``lowest``, the
        live array it merged into); None where no merged array does, or the live one is not
        laid out as it (not contiguous, of another size)."""
        spans = self._live_arrays
        i = bisect.bisect_right(spans, lowest, key=lambda span: span[0])
        if not (i and nbytes and lowest + nbytes <= spans[i - 1][1]):
            return None
        start, _, array, live = spans[i - 1]
        return (start, live) if live.flags.c_contiguous and live.nbytes == array.nbytes else None

    def _onto_live_arrays(self) -> None:
        """A tensor the run made over an array's memory (`torch.from_numpy(buffer.obs)`, made at
        the first update) that the merge adopted, where that array merged into the replay's:
        moved onto the live array's memory (``set_``: identity and views stay). It viewed the
        snapshot's copy of the array: what the program pushed into the buffer after the restart
        never reached the batches it sampled through the tensor (refused by the witness,
        corpus/lazy_buffer.py --memory-first). One storage per storage of the snapshot's, so
        views of one tensor stay one."""
        torch = self._torch
        if torch is None or not self._live_arrays:
            return
        moved: dict[int, object] = {}
        with torch.no_grad():
            for snap in self._adopted_tensors:
                theirs = _host_storage(torch, snap)
                if theirs is None:
                    continue
                nbytes = snap.untyped_storage().nbytes()
                span = self._merged_array_holding(theirs, nbytes)
                if span is None:
                    continue
                start, live = span
                storage = moved.get(theirs)
                if storage is None:
                    memory = flat_bytes(live)[theirs - start:theirs - start + nbytes]
                    storage = moved[theirs] = torch.from_numpy(memory).untyped_storage()
                snap.set_(storage, snap.storage_offset(), snap.size(), snap.stride())

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
            _set_requires_grad(live, snap.requires_grad)
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
    def _merge_list(self, live, snap, path: Path):
        """A list, or a deque of the same bound (a ring of recent losses): in place, so what holds
        the live one (`push = recent.append`, bound in setup) holds the run's items."""
        merged = []
        for i, item in enumerate(snap):
            merged.append((yield (live[i] if i < len(live) else None, item, path + f"[{i}]")))
        live.clear()
        live.extend([None] * len(merged))
        for i, value in enumerate(merged):
            self._store(live, i, value)
        return live

    def _merge_weak_set(self, live, snap, path: Path):
        """A ``weakref.WeakSet``: refilled in place with its items' live counterparts, which align
        as a dict's keys do."""
        yield from self._merge_dict(_SetItems(live), dict.fromkeys(snap), path)
        return live

    def _merge_tuple(self, live: tuple, snap: tuple, path: Path):
        merged = []
        for i, item in enumerate(snap):
            merged.append((yield (live[i] if i < len(live) else None, item, path + f"[{i}]")))
        self._building.discard(id(snap))
        if any(self._waits(value) for value in merged):
            # An item with no counterpart yet (`best = (loss, model)` met before `model`): an
            # immutable tuple settled now would hold a copy where the live object belongs; it is
            # built at finish, from what stands for each item then.
            return self._wait(snap, path)
        if len(merged) == len(live) and all(a is b for a, b in zip(merged, live)):
            result = live
        elif type(snap) is tuple:
            result = tuple(merged)
        elif hasattr(type(snap), "_make"):  # a namedtuple
            result = type(snap)._make(merged)
        else:
            result = snap
        return self._align(snap, result, path)

    def _merge_partial(self, live: functools.partial, snap: functools.partial, path: Path):
        """A ``functools.partial`` takes the run's function, arguments and keywords in place. Its
        ``__dict__`` is all a merge by attributes saw: where the run had bound another one at the
        replay's place (`trainer.loss_fn = partial(F.smooth_l1_loss, beta=0.5)` at a curriculum
        stage), the replay's arguments stood: refused by the witness where its steps called it
        (corpus/partial_stage.py, 2 of 3); one whose result no parameter shows would pass it."""
        parts = _PartialParts(live)
        self._store(parts, "func", (yield (live.func, snap.func, path + ".func")))
        self._store(parts, "args", (yield (live.args, snap.args, path + ".args")))
        self._store(parts, "keywords", (yield (live.keywords, snap.keywords, path + ".keywords")))
        if snap.__dict__:
            yield from self._merge_attrs(live, snap.__dict__, path)
        return live

    def _merge_dict(self, live: dict, snap: dict, path: Path, final: bool = False):
        keys = self._live_keys(snap, final, path)
        if keys is None:
            self._deferred.append((live, snap, path))
            return live
        merged = []
        elsewhere = _functions_under_other_keys(live, keys, snap)
        for live_key, (key, value) in zip(keys, snap.items()):
            here = live.get(live_key, elsewhere.get(live_key))
            merged.append((live_key, (yield (here, value, path + f"[{_key_text(key)}]"))))
        live.clear()
        for key, value in merged:
            self._store(live, key, value)
        return live

    def _live_keys(self, snap: dict, final: bool = False, path: Path = "") -> list | None:
        """The live key for each snapshot key, or None while an object key is not aligned."""
        keys = []
        torch = self._torch
        for key in snap:
            if type(key) is int and key in RUN_IDS:  # `{id(p): name ...}`: keyed by the live object's id
                obj = RUN_IDS[key]
                if id(obj) in self.aligned:
                    keys.append(id(self.aligned[id(obj)]))
                elif not final:
                    return None
                else:
                    keys.append(id(self._adopt(obj, path + "[<key id()>]")))
            elif isinstance(key, LiveObject) and key.made and (made := self._made_object(key, path)) is not None:
                keys.append(made)  # `scale = {Phase.WARMUP: 0.5, ...}` of an Enum main() defines: the replay's members
            elif _plain_key(key):
                keys.append(key)
            elif id(key) in self.aligned:
                keys.append(self.aligned[id(key)])
            elif not final:
                return None
            elif torch is not None and isinstance(key, torch.Tensor) and id(key) not in self._pending and id(key) not in self._adopted_later():
                # (a tensor that waits at a place of its own, a parameter of a head the run
                # replaced, is adopted there: the key is that tensor; so is one inside what
                # waits, a layer the run appended in a step, with its parameter group)
                raise StateMismatch(f"{path}: a key of this dict ({type(key).__name__}) has no counterpart in the program")
            else:
                keys.append(self._adopt(key, path + f"[<key {type(key).__name__}>]"))
        return keys

    def _merge_attrs(self, live, snap_attrs: dict, path: Path, snap_slots: dict | None = None, added=()):
        live_attrs = live.__dict__ if snap_attrs else {}
        # Object-keyed dicts (optimizer.state) come last: their keys align while the rest merges.
        for name in sorted(snap_attrs, key=lambda k: _has_object_keys(snap_attrs[k])):
            value = snap_attrs[name]
            if isinstance(value, LiveOnly) and name not in live_attrs and not _made_again(value):
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

    def _merge_hook_handle(self, live, snap: HookHandle, path: Path):
        """The handle the program holds of a hook (``register_forward_hook``'s, kept to remove
        the hook later) removes it from the live dict, under the run's id: the replay's handle
        where it holds one at this place, else a handle made here."""
        torch = self._torch
        handle_type = torch.utils.hooks.RemovableHandle
        handle = live if type(live) is handle_type else handle_type.__new__(handle_type)
        lives = [live.hooks_dict_ref(), *(ref() for ref in live.extra_dict_ref or ())] if handle is live else []
        snaps = [snap.hooks, *snap.extra]
        dicts = _HandleDicts(handle, len(snaps))
        handle.id = snap.id
        self._align(snap, handle, path)
        for i, snap_dict in enumerate(snaps):
            where = path + (".hooks_dict" if i == 0 else f".extra_dict[{i - 1}]")
            self._store(dicts, i, (yield (lives[i] if i < len(lives) else None, snap_dict, where)) if snap_dict is not None else None)
        return handle

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

    def _other_function(self, live, snap: LiveFunction, path: Path) -> StateMismatch | None:
        """Where the replay holds another function than the run's at a place (a lambda the loop
        made after setup, where the replay holds setup's), the refusal should the run's not be
        made again: its cells must not go into the replay's code, nor, without cells, the
        replay's code go on in its place. None where the replay holds the run's."""
        code = getattr(live, "__code__", None)
        if type(live) is not types.FunctionType or code.co_qualname != snap.qualname:
            found = code.co_qualname if type(live) is types.FunctionType else type(live).__name__
            return StateMismatch(f"{path}: the snapshot holds function {snap.qualname} here, the replayed program {found}")
        if snap.line is not None and self.same_sources and code.co_firstlineno != snap.line:
            return StateMismatch(
                f"{path}: the snapshot holds {snap.qualname} of line {snap.line} here, the replayed program the "
                f"one of line {code.co_firstlineno}, and the run's could not be made again here (its code, or a cell "
                "it shares with a frame, is not in the replayed program)",
                hint="make it before the loop, or at module level (functools.partial for its values), "
                     "or restart from a snapshot taken before the loop made it")
        return None

    def _merge_cells(self, live, snap: LiveFunction, path: Path):
        code = live.__code__
        cells = {name: (i, cell) for i, (name, cell) in enumerate(zip(code.co_freevars, live.__closure__ or ()))}
        for name, run_id in snap.made.get("cell_ids", {}).items():  # a function made again shares them
            if name in cells:
                self._run_cells.setdefault(run_id, cells[name][1])
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

    def _merge_class(self, live, snap: LiveClass, path: Path):
        if not isinstance(live, type) or live.__qualname__ != snap.qualname:
            found = live.__qualname__ if isinstance(live, type) else type(live).__name__
            raise StateMismatch(f"{path}: the snapshot holds class {snap.qualname} here, the replayed program {found}")
        for name, value in snap.attrs.items():
            self._store(_Attr(live), name, (yield (vars(live).get(name), value, path + f".{name}")))
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


class _SetItems:
    """A set seen as a mapping of its items to None: what ``_merge_dict`` refills."""

    def __init__(self, items):
        self.items = items

    def get(self, key, default=None):
        return None

    def clear(self) -> None:
        self.items.clear()

    def __setitem__(self, key, value) -> None:
        self.items.add(key)


def _made_again(placeholder: LiveOnly) -> bool:
    """Whether the merge makes this placeholder's object again where the replay holds none: a
    file is opened again, a writer made over it, an object of a class the program defined in a
    function made of the replay's class."""
    return isinstance(placeholder, (LiveFile, LiveOverFile)) or (isinstance(placeholder, LiveObject) and bool(placeholder.made))


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


def _functions_under_other_keys(live: dict, keys: list, snap: dict) -> dict:
    """For each snapshot key the live dict lacks whose value is a function of the program, the
    replay's function of the same code that this dict holds under a key the snapshot lacks. Hook
    dicts (a module's `_forward_hooks`, an optimizer's) are keyed by the ids torch's counter gave
    out: a hook registered at a phase change, in a loop's body prefix the replay runs again, has
    another id in the replay where the run registered other hooks before it (an evaluation's,
    registered and removed each epoch)."""
    missing = [(key, value) for key, value in zip(keys, snap.values())
               if isinstance(value, LiveFunction) and key not in live]
    if not missing:
        return {}
    taken = set(keys)
    spare = [value for key, value in live.items() if key not in taken and type(value) is types.FunctionType]
    found = {}
    for key, value in missing:
        for function in spare:
            if function.__code__.co_qualname == value.qualname and function.__code__.co_firstlineno == value.line:
                found[key] = function
                spare.remove(function)
                break
    return found


def _has_object_keys(value) -> bool:
    return isinstance(value, dict) and any(not _plain_key(k) or (type(k) is int and k in RUN_IDS) for k in value)


def _picklable(value) -> bool:
    """Can pickle reduce ``value`` (the C++ objects torch binds without pickle support cannot)?"""
    try:
        value.__reduce_ex__(5)
    except Exception:  # noqa: BLE001 - whatever it raises, it is no data the snapshot holds
        return False
    return True


def _held_in_place(torch, live, path: Path) -> bool:
    """Whether a tensor of another shape or kind must change in place rather than give its place
    to the snapshot's: a parameter, a buffer or an optimizer's state (a module or an optimizer
    holds it by identity); a plain tensor's place takes the snapshot's."""
    return isinstance(live, torch.nn.Parameter) or any(s in ("._buffers", ".state") for s in path.suffixes())


def _host_storage(torch, t) -> int | None:
    """The address of a plain strided host tensor's storage; None for anything else, an empty
    storage (all have address 0) or a tensor without one (a nested tensor's)."""
    if (not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.layout != torch.strided or t.is_nested
            or isinstance(t, torch.nn.parameter.UninitializedTensorMixin)):
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return storage.data_ptr() if storage.nbytes() else None


def _set_requires_grad(live, requires_grad: bool) -> None:
    """Whether a leaf trains is state the program sets mid-run (a backbone unfrozen at an epoch,
    a layer frozen for the last one), which the replay's setup does not repeat. The snapshot
    notes it for leaves only: a tensor computed from others takes it from its graph."""
    if live.is_leaf and live.requires_grad != requires_grad:
        live.requires_grad_(requires_grad)
