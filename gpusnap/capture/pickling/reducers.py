"""The buffer reducers of the graph pickler: what stands in the pickle stream for memory whose
bytes go to the store's buffers (``sink.put_buffer``) or to staged device ranges, never through
the stream: torch tensors and storages (on the CPU and on devices), DTensors, numpy arrays, CuPy
arrays and cuda.core Buffers. ``HostMemory`` reads the trainee's host memory as it was at fork.

``BufferReducers`` is a part of ``pickler.GraphPickler`` and works on its state: ``sink``,
``host``, ``device``, ``buffers``, ``storage_names``, ``storage_offsets``, ``device_wanted``,
``core_buffers``, ``tensors``, ``_storage_dtype`` and the modules it found (``_torch``, ``_np``),
and falls back to its ``_live`` and ``_reduce_by_pickle``."""

from __future__ import annotations

from gpusnap.errors import CaptureError
from gpusnap.graph.load import (
    _core_buffer,
    _inline_array,
    _load_device_storage,
    _load_storage,
    _meta_storage,
    _ndarray_over,
    _raw_ndarray,
    _rebuild_cupy,
    _rebuild_ndarray,
    _rebuild_tensor,
    _sharded_tensor,
    _storage_of_ndarray,
    array_base,
    dtensor_layout,
    grad_hook_dicts,
)
from gpusnap.rawmem import mapped, strided_extent, view_at
from gpusnap.stage.drain import Drained
from gpusnap.stage.sources import HOST_KINDS

_SHARDED_TENSORS = {"torch.distributed.tensor.DTensor", "torch.distributed._tensor.api.DTensor",
                    "torch.distributed.tensor._api.DTensor"}
_named: dict[tuple[type, int], bool] = {}


def _is_named(cls, names: set[str]) -> bool:
    key = (cls, id(names))
    found = _named.get(key)
    if found is None:
        found = _named[key] = any(f"{k.__module__}.{k.__qualname__}" in names for k in cls.__mro__)
    return found


class BufferReducers:
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
            return self._reduce_by_pickle(t)
        storage = t.untyped_storage()
        dtype = str(t.dtype).removeprefix("torch.")
        key = _storage_key(storage)
        self._storage_dtype.setdefault(key, (dtype, t.element_size()))
        is_param = type(t) is torch.nn.Parameter
        grad = t.grad if t.is_leaf else None
        attrs = dict(t.__dict__) if t.__dict__ else None
        requires_grad = t.requires_grad and t.is_leaf
        self.tensors.append((t, key))
        # id(t): a program may keep it as an int (`{id(p): name for name, p in ...}`), which the
        # merge maps to the id of the live tensor that stands for this one (graph.load.RUN_IDS);
        # its gradient hooks, the dicts of them (the merge gives the replay's tensor the run's
        # where it has others: graph.load.GRAD_HOOKS). A leaf's only: a tensor computed in a past
        # iteration (`h.register_hook(keep_grad)` on an activation) has no graph left to fire them
        args = (storage, t.storage_offset(), tuple(t.size()), tuple(t.stride()), dtype, requires_grad, grad, is_param, attrs, id(t))
        hooks = grad_hook_dicts(t) if t.is_leaf else None
        return _rebuild_tensor, (args + (hooks,) if hooks else args)

    def _reduce_made_state(self, generator):
        """A random generator: torch's, or NumPy's RandomState or bit generator. Its reduction
        asks for its state, arrays made here in the writer, where the writer's heap may have
        grown past the map frozen at fork (``rawmem.freeze_maps``): read through ``HostMemory``,
        that memory passed for page-locked memory the fork did not pass on, and the snapshot
        failed. Their few bytes go inline instead (``InlineArray``)."""
        rv = generator.__reduce__()
        return (*rv[:2], *(self._inlined(part) for part in rv[2:]))

    def _inlined(self, value):
        if isinstance(value, dict):
            return {key: self._inlined(item) for key, item in value.items()}
        if type(value) in (tuple, list):
            return type(value)(self._inlined(item) for item in value)
        np, torch = self._np, self._torch
        if np is not None and type(value) is np.ndarray:
            return InlineArray("numpy", value)
        if torch is not None and type(value) is torch.Tensor:
            return InlineArray("torch", value.numpy())
        return value

    def _reduce_storage(self, storage):
        torch = self._torch
        if isinstance(storage, torch.TypedStorage):
            storage = storage.untyped()
        key = _storage_key(storage)
        device, address, nbytes = key
        if device == "meta":
            # Sizes and no bytes: a model moved to the meta device as the template torch.func's
            # ensembling calls (`base = copy.deepcopy(model).to("meta")`), or made there before its
            # weights load. Its record claimed bytes no chunk held, and every snapshot of such a
            # program failed (corpus/ensemble_vmap.py); its tensors also share no memory to keep.
            return _meta_storage, (nbytes,)
        if device != "cpu" and nbytes:
            return self._reduce_device_storage(storage, key)
        name = self.storage_names.get(key)
        if name is None and device == "cpu" and nbytes:
            owner = self._shared_host(address, nbytes, storage)
            if owner is not storage:  # `torch.from_numpy(memory)`, the array (or a wider tensor's) pickled first
                return _storage_of_ndarray, (owner, address - _start_address(owner), nbytes)
        if name is None:
            if device == "cpu":
                view = self.host.storage(address, nbytes)
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
        address = arr.__array_interface__["data"][0]
        tensor = self._tensor_under(arr)
        if tensor is not None:  # `w = p.detach().numpy()`: a view of the tensor's memory, kept one
            offset = address - tensor.untyped_storage().data_ptr()
            return _ndarray_over, (tensor, offset, arr.dtype.str, arr.shape, arr.strides)
        root = self._viewed_array(arr)
        if root is not None:  # `recent = ring[8:]`: a view of an array, kept one
            return _ndarray_over, (root, address - _start_address(root), arr.dtype.str, arr.shape, arr.strides)
        lowest, nbytes = strided_extent(address, arr.shape, arr.strides, arr.itemsize)
        if nbytes:  # a view of an array pickled before, or a from_numpy tensor's memory
            owner = self._shared_host(lowest, nbytes, arr, note=arr.flags.c_contiguous)
            if owner is not arr:
                return _ndarray_over, (owner, address - _start_address(owner), arr.dtype.str, arr.shape, arr.strides)
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

    def _shared_host(self, address: int, nbytes: int, candidate, note: bool = True):
        """The host memory pickled so far (a torch storage, or a contiguous NumPy array) that
        starts at ``address`` and holds ``nbytes``; ``candidate`` where none does (noted as such,
        with ``note``). A tensor made by ``torch.from_numpy`` shares the array's memory, and a
        reshaped array its base's: pickled apart, they came back apart, and what the program
        wrote through one no longer reached the other. By start address alone (a dict: a
        snapshot holds up to millions of arrays): a view that starts inside another's memory
        (``torch.from_numpy(memory[2])``) comes back apart, as before."""
        found = self._host_memory.get(address)
        if found is not None and nbytes <= found[0]:
            return found[1]
        if note and found is None:
            self._host_memory[address] = (nbytes, candidate)
        return candidate

    def _viewed_array(self, arr):
        """The plain contiguous array whose memory ``arr`` views (the last array of its ``base``
        chain), where pickling it whole costs little more than ``arr``: at most 4 times its
        bytes and 1 MiB. None otherwise, and for an array that views none. Pickled as its own
        bytes, a view made mid-run came back apart from the array the program writes, and a
        restart said "verified" with other bytes (ring_stats.py); a small view of a large array
        still does (the array may not be the program's to keep)."""
        np = self._np
        root, _ = array_base(arr)
        if (root is None or type(root) is not np.ndarray or not root.flags.c_contiguous or root.dtype.hasobject
                or root.nbytes > 4 * arr.nbytes + (1 << 20)):
            return None
        return root

    def _tensor_under(self, arr):
        """The host tensor whose memory ``arr`` views (its ``base``, through views of it), or None."""
        torch = self._torch
        _, base = array_base(arr)
        if torch is None or not isinstance(base, torch.Tensor) or base.device.type != "cpu" or base.layout != torch.strided:
            return None
        try:
            storage = base.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        lowest, nbytes = strided_extent(arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.itemsize)
        start = storage.data_ptr()
        return base if nbytes and start <= lowest and lowest + nbytes <= start + storage.nbytes() else None

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
        if found is not None:
            return found
        found = _host_view(address, nbytes, what)
        self.drained.lend(address, nbytes)
        return found

    def storage(self, address: int, nbytes: int) -> memoryview:
        """A CPU tensor storage the pickler reached: drained first when it may be."""
        self.drained.reach(address, nbytes)
        return self.view(address, nbytes, "CPU tensor")


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


def _storage_key(storage) -> tuple:
    return (storage.device.type, storage.data_ptr(), storage.nbytes())


def _start_address(owner) -> int:
    """Where the host memory of ``owner`` (``_shared_host``'s: an untyped storage or an array) starts."""
    data_ptr = getattr(owner, "data_ptr", None)  # (a storage: torch is imported)
    return data_ptr() if data_ptr is not None else owner.__array_interface__["data"][0]


class InlineArray:
    """A small array pickled by its bytes, not through ``HostMemory``: one the writer made."""

    __slots__ = ("kind", "array")

    def __init__(self, kind: str, array):
        self.kind, self.array = kind, array

    def __reduce__(self):
        array = self.array
        return _inline_array, (self.kind, array.dtype.str, array.shape, array.tobytes())
