"""The witness: what the iterations after a snapshot did, so that every restart proves itself.

Fast-forward and merge are exact for every mechanism gpusnap knows of; a mechanism nobody
thought of (a collator drawing random numbers while an iterator fetches one batch ahead) would
restore other bytes and report success. So the program that took a snapshot goes on recording
the next ``knobs.WITNESS_ITERATIONS`` iterations of its step loop (``Recorder``), and one more:
the first after a DataLoader iterator is made again (the next epoch's first, where reshuffling
happens). A restarted run computes the same records from its merge on and compares them
(``Checker``): on the first difference it stops before its next optimizer step.

The record of one iteration, taken at the step-loop boundary that ends it::

    {"iteration": n,                      # step-loop iterations in which an optimizer stepped
     "batch": hex | None, "why": text,    # what it consumed (None: could not be digested, why)
     "rng": {"random": hex, "numpy": hex, "torch": hex, "torch.cuda": hex}}   # after it

"What it consumed" is the step loop's item (a ``for`` loop's) and every batch a DataLoader
iterator returned during the iteration, each digested as it arrives (``graph.digest``; device
tensors are copied to the host first). After the first optimizer step following the snapshot,
``params`` digests every parameter of that optimizer: CPU tensors by their bytes, device tensors
by a 64-bit sum of their words computed on the device. Parameters are compared only where both
runs are bitwise reproducible (``exact``: no device parameters, or deterministic algorithms) and
do their arithmetic alike (``arithmetic``: the same torch, CPU kernels, threads and devices).

A program that steps no torch.optim optimizer (functional training, an update written by hand)
has no ``params``: instead, at the first record, ``locals`` digests the host tensors that the
step loop's frame holds in each local (``locals_digests``), compared by name.

Both are taken again at each boundary of the window, the last recorded kept (``params_last``,
``locals_last``: a witness cut short by a kill holds the last boundary it reached): what an
iteration does to the parameters after its optimizer step (a decay written through a NumPy view
of a weight) shows there. A restore that put such a view apart from the weight computed the
same first step, and the witness once said "verified" with other bytes.

At the first record too, ``shared`` lists which tensors the step loop's frame holds share
memory with another it holds (``shared_places``: `best_state = model.state_dict()` without a
copy shares the parameters'). A restore that held them apart would compute the same first
iterations and end elsewhere: the parameters' steps no longer reach the other place.

The witness file (``witness/<id>.json``, docs/FORMAT.md)::

    {"format": 1, "snapshot": id, "loops": [[file, function, "LINE:COL"], ...],
     "iterations": [record, ...],
     "params": {"iteration": n, "digest": hex, "exact": bool, "arithmetic": {...}} | None,
     "locals": {"iteration": n, "digests": {name: hex}, "arithmetic": {...}},   # only without params
     "params_last": like params, "locals_last": like locals,   # at the last boundary recorded
     "shared": {"iteration": n, "pairs": [[place, first place sharing its memory], ...]},
     "epoch": record | None}

Both sides run in the trainee, driven by capture's hooks (``at_boundary``, ``fetched``,
``loader_made``, ``stepped`` on ``active``): recording costs a few digests per snapshot, and
nothing between windows but one global lookup per DataLoader batch.
"""

from __future__ import annotations

import collections
import sys

import xxhash

from gpusnap import knobs
from gpusnap.graph import rng
from gpusnap.graph.digest import digest

FORMAT = 1
# A restart whose steps run this many times the optimizers it steps without ending an iteration
# of the witness's loop is somewhere else than the run that took the snapshot.
STEPS_PER_OPTIMIZER = 16
active = None  # the Recorder or Checker of this process, if any


def loop_key(loop) -> list:
    code = loop.frame.f_code
    return [code.co_filename, code.co_qualname, loop.loop_id]


class _Watch:
    """What both sides compute: the records of the iterations after the snapshot, at the
    boundaries of the step loops the run that took it knew (``loops``: ``loop_key``s), so that
    a restart, which learns its step loop only at its first optimizer step, records the same."""

    def __init__(self, snap_id: str, window: int, loops: list):
        self.loops = [list(key) for key in loops]
        self._keys = {tuple(key) for key in self.loops}
        self.snap_id = snap_id
        self.window = window  # iterations of the window still to record
        self.batches: list[tuple[str | None, str | None]] = []  # (digest, why) of this iteration's batches
        # The last batches fetched, held: is the loop's item one of them? By id() alone, an item
        # could take the address of a batch fetched and freed earlier in the iteration (an
        # evaluation's, in the record after the next iter(loader)) and go undigested in one
        # process and not in the other. Two: a loader that looks one batch ahead.
        self.recent: collections.deque = collections.deque(maxlen=2)
        self.params_due = True
        self.param_optimizer = None  # the optimizer ``params`` digested: again at each boundary
        self.epoch_armed = False  # the window is over: the next iter(loader) starts the epoch record
        self.epoch_due = False  # an iter(loader) came: the next boundary ends the epoch record

    def wants_boundary(self) -> bool:
        return self.window > 0 or self.epoch_due

    def watches(self, loop) -> bool:
        """Does this boundary end an iteration of a watched loop? (A loop's start ends none.)"""
        if loop.index <= 0:
            return False
        code = loop.frame.f_code
        return (code.co_filename, code.co_qualname, loop.loop_id) in self._keys

    def fetched(self, batch) -> None:
        if self.window > 0 or self.epoch_due:
            self.batches.append(host_digest(batch))
            self.recent.append(batch)

    def loader_made(self) -> bool:
        """An ``iter(loader)``; True when the next boundary must be watched."""
        if self.epoch_armed and not self.epoch_due:
            self.epoch_due = True
            return True
        return False

    def record(self, item, iteration: int) -> dict:
        parts, why = [], None
        if item is not _NO_ITEM and all(item is not batch for batch in self.recent):
            parts.append(host_digest(item))
        parts += self.batches
        self.batches = []
        self.recent.clear()
        h = xxhash.xxh3_128()
        for value, reason in parts:
            if value is None:
                why = reason
                break
            h.update(value.encode())
        out = {"iteration": iteration, "batch": h.hexdigest() if parts and why is None else None, "rng": rng_digests()}
        if why is not None:
            out["why"] = why
        elif not parts:
            out["why"] = "nothing consumed that gpusnap sees (no loop item, no DataLoader batch)"
        return out

    def params(self, optimizer, iteration: int) -> dict | None:
        if not self.params_due:
            return None
        self.params_due = False
        self.param_optimizer = optimizer
        return _params_record(optimizer, iteration)

    def last_digests(self, record: int, iteration: int, frame, with_locals: bool) -> dict:
        """``params_last`` (of the optimizer ``params`` digested) or, ``with_locals``,
        ``locals_last``, at the boundary of the window's ``record``-th iteration (1, 2, ...: a
        program without an optimizer counts no iterations). The optimizer is let go at its last."""
        optimizer = self.param_optimizer
        if self.window == 0:
            self.param_optimizer = None
        if optimizer is not None:
            return {"params_last": {**_params_record(optimizer, iteration), "record": record}}
        if with_locals and frame is not None:
            return {"locals_last": {"iteration": iteration, "record": record, "digests": locals_digests(frame),
                                    "arithmetic": arithmetic()}}
        return {}


_NO_ITEM = object()
NO_ITEM = _NO_ITEM  # a while loop's iteration: no item


class Recorder(_Watch):
    """The run that took snapshot ``snap_id`` records what followed it; ``on_update(doc)`` after
    each record (the capture side writes the witness once the snapshot is committed)."""

    holds_snapshots = False

    def __init__(self, snap_id: str, on_update, loops: list, window: int | None = None, token: str | None = None):
        super().__init__(snap_id, knobs.WITNESS_ITERATIONS if window is None else window, loops)
        self.on_update = on_update
        self.doc = {"format": FORMAT, "snapshot": snap_id, "loops": self.loops, "iterations": [], "params": None, "epoch": None}
        if token is not None:
            self.doc["token"] = token

    def at_boundary(self, item, iteration: int, frame=None) -> None:
        record = self.record(item, iteration)
        if self.window > 0:
            if not self.doc["iterations"] and frame is not None:
                self.doc["shared"] = {"iteration": iteration, "pairs": shared_places(frame)}
                digests = locals_digests(frame) if self.doc["params"] is None else None
                if digests:  # (none without torch)
                    self.doc["locals"] = {"iteration": iteration, "digests": digests, "arithmetic": arithmetic()}
            self.doc["iterations"].append(record)
            self.window -= 1
            self.epoch_armed = self.window == 0
            self.doc.update(self.last_digests(len(self.doc["iterations"]), iteration, frame, "locals" in self.doc))
        elif self.epoch_due:
            self.doc["epoch"] = record
            self.epoch_due = False
            self.epoch_armed = False
            stop_watching(self)
        self.on_update(self.doc)

    def stepped(self, optimizer, iteration: int) -> None:
        found = self.params(optimizer, iteration)
        if found is not None:
            self.doc["params"] = found

    def window_done(self) -> bool:
        return self.window == 0


class Checker(_Watch):
    """A restarted run compares its iterations after the merge with the witness ``doc``:
    ``fail(message)`` on the first difference (it does not return unless ``force``: then each
    difference is ``warn``ed), ``verified(count, differences, uncompared)`` once the window
    matched, ``uncompared`` saying what could not be compared and why (other arithmetic here: a
    restart on another machine compares batches and random generators only)."""

    def __init__(self, doc: dict, fail, warn, verified, force: bool = False):
        expected = list(doc.get("iterations") or [])
        super().__init__(str(doc.get("snapshot")), len(expected), doc.get("loops") or [])
        self.expected, self.epoch, self.expected_params = expected, doc.get("epoch"), doc.get("params")
        self.expected_locals = doc.get("locals") if isinstance(doc.get("locals"), dict) else None
        self.expected_shared = doc.get("shared") if isinstance(doc.get("shared"), dict) else None
        self.expected_last = {key: doc[key] for key in ("params_last", "locals_last") if isinstance(doc.get(key), dict)}
        self.fail, self.warn, self.verified, self.force = fail, warn, verified, force
        self.compared = 0
        self.differences = 0
        self.uncompared: set[str] = set()  # why the parameters (or the frame's tensors) were not compared
        self.params_found = None  # after the first optimizer step: compared at the boundary that follows
        self.steps = 0  # optimizer steps since the last boundary, while the window is open
        self.stepping: set[int] = set()  # ids of the optimizers that stepped since the merge

    @property
    def holds_snapshots(self) -> bool:
        """A run not yet proven writes no snapshot: a wrong one would be restored next time."""
        return self.window > 0

    def at_boundary(self, item, iteration: int, frame=None) -> None:
        record = self.record(item, iteration)
        self.steps = 0
        if self.window > 0:
            want = self.expected[self.compared]
            self.compared += 1
            self.window -= 1
            self._compare(record, want, f"iteration {want.get('iteration')} (the {_nth(self.compared)} after the snapshot)")
            self._compare_params()
            if self.compared == 1 and frame is not None:  # what the first record alone holds
                if self.expected_locals is not None:
                    self._compare_locals(iteration, frame)
                if self.expected_shared is not None:
                    self._compare_shared(iteration, frame)
            if not self.differences:  # (one difference is enough: --force warns of each once)
                self._compare_last(iteration, frame)
            if self.window == 0:
                self.epoch_armed = self.epoch is not None
                self.verified(self.compared, self.differences, sorted(self.uncompared))
                if not self.epoch_armed:
                    stop_watching(self)
        elif self.epoch_due:
            self.epoch_due = self.epoch_armed = False
            self._compare(record, self.epoch, f"iteration {self.epoch.get('iteration')} (the first after a DataLoader started again)")
            stop_watching(self)

    def stepped(self, optimizer, iteration: int) -> None:
        if (self.expected_params is not None or "params_last" in self.expected_last) and self.params_due:
            self.params_found = self.params(optimizer, iteration)
        if self.window > 0:
            self.steps += 1
            self.stepping.add(id(optimizer))
            # An iteration steps each optimizer a few times at most (a WGAN's critic five); the
            # optimizer step fused into backward steps one optimizer per parameter, once each.
            if self.steps > STEPS_PER_OPTIMIZER * len(self.stepping):
                self._differs(f"the run took {self.steps} optimizer steps after the snapshot without ending an iteration "
                              f"of the loop where the run that took it recorded its witness ({_where(self.loops)})")
                self.window = 0  # --force: stop looking
                stop_watching(self)

    def _compare_params(self) -> None:
        want, found = self.expected_params, self.params_found
        if found is None or want is None:
            return
        self.params_found = None
        if _params_differ(want, found, self.uncompared):
            self._differs(f"after the optimizer step of iteration {want.get('iteration')}, the parameters differ from the run that took it")

    def _compare_last(self, iteration: int, frame) -> None:
        """At the last boundary the witness recorded: the parameters (or the frame's tensors) again."""
        want = next(iter(self.expected_last.values()), None)
        if want is None or want.get("record") != self.compared:
            return  # (the run recorded it at the window's last boundary, which lets the optimizer go)
        found = self.last_digests(self.compared, iteration, frame, "locals_last" in self.expected_last)
        when = f"after the {_nth(self.compared)} iteration after the snapshot (the last the witness holds)"
        if "params_last" in found and "params_last" in self.expected_last:
            if _params_differ(self.expected_last["params_last"], found["params_last"], self.uncompared):
                self._differs(f"{when}, the parameters differ from the run that took it")
        elif "locals_last" in found and "locals_last" in self.expected_last:
            self._compare_digests(self.expected_last["locals_last"], found["locals_last"]["digests"], iteration, when)

    def _compare_locals(self, iteration: int, frame) -> None:
        if "torch" in sys.modules:
            self._compare_digests(self.expected_locals, locals_digests(frame), iteration,
                                  "after the first iteration after the snapshot")

    def _compare_digests(self, want: dict, mine: dict, iteration: int, when: str) -> None:
        if want.get("iteration") != iteration:
            return  # another iteration is reported by _compare
        if want.get("arithmetic") != (mine_arithmetic := arithmetic()):
            self.uncompared.add(f"the loop's tensors: {_arithmetic_change(want.get('arithmetic'), mine_arithmetic)}")
            return  # other arithmetic, other last bits
        theirs = want.get("digests") or {}
        differ = [name for name in mine if name in theirs and mine[name] != theirs[name]]
        if differ:
            self._differs(f"{when}, the tensors in {', '.join(differ[:5])}"
                          f"{' ...' if len(differ) > 5 else ''} differ from the run that took it (no optimizer to compare)")

    def _compare_shared(self, iteration: int, frame) -> None:
        want = self.expected_shared
        if want.get("iteration") != iteration:
            return  # another iteration is reported by _compare
        theirs = {tuple(pair) for pair in want.get("pairs") or []}
        mine = {tuple(pair) for pair in shared_places(frame)}
        if theirs != mine:
            place, other = sorted(theirs ^ mine)[0]
            how = ("shared memory in the run that took it, and here they do not" if (place, other) in theirs
                   else "share memory here, and in the run that took it they did not")
            self._differs(f"after the first iteration after the snapshot, {place} and {other} {how}")

    def _compare(self, record: dict, want: dict, when: str) -> None:
        if record["iteration"] != want.get("iteration"):
            self._differs(f"the run counted iteration {record['iteration']} where the run that took it was at {when}")
            return
        if want.get("batch") is not None and record["batch"] is not None and record["batch"] != want["batch"]:
            self._differs(f"{when} consumed another batch than in the run that took it")
            return
        mine, theirs = record["rng"], want.get("rng") or {}
        for name in sorted(set(mine) | set(theirs)):
            if mine.get(name) != theirs.get(name):
                self._differs(f"after {when}, {_GENERATORS.get(name, name)} random number generator stands elsewhere "
                              "than in the run that took it")
                return

    def ended(self) -> None:
        """The program ended with the window open: what it reached matched (or was warned of)."""
        if self.window > 0 and self.compared:
            self.window = 0
            self.verified(self.compared, self.differences, sorted(self.uncompared))
        stop_watching(self)

    def _differs(self, message: str) -> None:
        self.differences += 1
        if not self.force:
            self.fail(message)
        self.warn(message)


_GENERATORS = {"random": "the random module's", "numpy": "numpy's global", "torch": "torch's CPU", "torch.cuda": "torch's CUDA"}


def _params_record(optimizer, iteration: int) -> dict:
    value, exact = params_digest(optimizer)
    return {"iteration": iteration, "digest": value, "exact": exact, "arithmetic": arithmetic()}


def _params_differ(want: dict, found: dict, uncompared: set) -> bool:
    """Whether two ``params`` records tell of other parameters: only where both runs are bitwise
    reproducible and do their arithmetic alike (else why not goes into ``uncompared``)."""
    if not (want.get("exact") and found["exact"]) or want.get("digest") is None:
        # a GPU run without deterministic algorithms: its steps may round otherwise
        uncompared.add("the parameters: device parameters without deterministic algorithms round otherwise from run to run")
        return False
    if want.get("arithmetic") != found["arithmetic"]:
        # other threads, kernels or devices sum in another order: other last bits
        uncompared.add(f"the parameters: {_arithmetic_change(want.get('arithmetic'), found['arithmetic'])}")
        return False
    return found["iteration"] != want.get("iteration") or found["digest"] != want["digest"]


def _arithmetic_change(theirs: dict | None, mine: dict) -> str:
    """What of ``arithmetic()`` differs, in words: "other arithmetic here (threads 2, 1 in the run)"."""
    theirs = theirs or {}
    changed = [f"{name} {mine.get(name)}, {theirs.get(name)} in the run" for name in sorted(set(theirs) | set(mine))
               if theirs.get(name) != mine.get(name)]
    return f"other arithmetic here ({'; '.join(changed)})"


def _where(keys: list) -> str:
    return ", ".join(f"{file}:{loop_id.split(':')[0]} in {function}" for file, function, loop_id in keys)


def _nth(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def stop_watching(watch) -> None:
    global active
    if active is watch:
        active = None


# -- digests ---------------------------------------------------------------------------------
def host_digest(obj) -> tuple[str | None, str | None]:
    """``graph.digest`` of a batch, device tensors copied to the host (the trainee may)."""
    return digest(obj, host_copy=_to_host)


def _to_host(tensor):
    return tensor.detach().to("cpu")


def rng_digests() -> dict:
    """A short digest of each global generator's state (``rng.compact()``), by name."""
    rand, gauss, np_state, torch_state, cuda = rng.compact()
    out = {"random": xxhash.xxh3_64_hexdigest(rand + repr(gauss).encode())}
    if np_state is not None:
        out["numpy"] = xxhash.xxh3_64_hexdigest(np_state)
    if torch_state is not None:
        out["torch"] = xxhash.xxh3_64_hexdigest(torch_state.numpy().tobytes())
    if cuda:
        out["torch.cuda"] = xxhash.xxh3_64_hexdigest(b"".join(t.numpy().tobytes() for t in cuda))
    return out


def arithmetic() -> dict:
    """What decides the last bits of the same computation: torch's version, its CPU kernels, the
    intra-op threads that split reductions, the devices."""
    torch = sys.modules["torch"]
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "cpu": torch.backends.cpu.get_cpu_capability()}
    if torch.cuda.is_initialized():
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return out


# A local's tensors above this are left out of its digest (both runs alike): a dataset the frame
# holds would cost the training process its hashing time once per snapshot.
LOCALS_MAX_BYTES = 256 << 20


def locals_digests(frame) -> dict[str, str]:
    """{name: xxh3-64} for each local of ``frame`` (its globals, at module level) that holds host
    tensors: a tensor, a module's state dict, or a list, tuple or dict of tensors. A program
    without a torch.optim optimizer has no ``params`` to compare (functional training, a
    DP-SGD by hand, a step written as ``p -= lr * p.grad``): this is where its state is."""
    torch = sys.modules.get("torch")
    out = {}
    for name, tensors in _frame_tensors(torch, frame):
        try:
            h = xxhash.xxh3_64()
            for key, t in tensors:
                h.update(f"{key} {t.dtype} {tuple(t.shape)};".encode())
                if t.numel() and t.numel() * t.element_size() <= LOCALS_MAX_BYTES:
                    h.update(t.contiguous().view(-1).view(torch.uint8).numpy())
        except Exception:  # noqa: BLE001 - a tensor without plain bytes (quantized): left out
            continue
        out[name] = h.hexdigest()
    return out


def shared_places(frame) -> list[list[str]]:
    """[[place, the first place in name order whose tensor shares its memory], ...] over the
    tensors ``frame``'s locals hold, as ``locals_digests`` finds them, device tensors included
    (no byte is read), a module's by its named parameters and buffers: its state-dict hooks may
    communicate (FSDP gathers a full state dict). Places are `name` or `name[key]`."""
    first: dict = {}
    pairs = []
    for name, tensors in _frame_tensors(sys.modules.get("torch"), frame, host_only=False, state_dict=False):
        for key, t in tensors:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a nested tensor's: none to share
                continue
            if storage.nbytes() == 0:
                continue
            place = f"{name}[{key}]" if key != "" else name
            found = first.setdefault((str(t.device), storage.data_ptr()), place)
            if found != place:
                pairs.append([place, found])
    return pairs


def _frame_tensors(torch, frame, **which):
    """(name, ``_held_tensors``) for each local of ``frame`` in name order that holds tensors; a
    local whose tensors cannot be listed (a state-dict hook that raises) is left out, in both
    runs alike."""
    if torch is None:
        return
    names = frame.f_locals
    for name in sorted(names):
        if name.startswith("__"):
            continue
        try:
            tensors = _held_tensors(torch, names[name], **which)
        except Exception:  # noqa: BLE001
            continue
        if tensors:
            yield name, tensors


def _held_tensors(torch, value, host_only: bool = True, state_dict: bool = True) -> list:
    """(key, plain tensor) pairs: the value itself, a module's state dict (or, without
    ``state_dict``, its named parameters and buffers), a container's tensors one level down.
    Device tensors are left out unless ``host_only`` is false: their bytes are not read here."""
    if isinstance(value, torch.nn.Module):
        items = (list(value.state_dict(keep_vars=True).items()) if state_dict
                 else [*value.named_parameters(), *value.named_buffers()])
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        items = [("", value)]
    found = []
    for key, t in items:
        if (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
                and (t.device.type == "cpu" or not host_only)):
            found.append((key, t.detach()))
    return found


def params_digest(optimizer) -> tuple[str | None, bool]:
    """(digest of every parameter the optimizer steps, whether it is bitwise reproducible)."""
    torch = sys.modules.get("torch")
    h = xxhash.xxh3_128()
    device_sums = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            t = p.detach()
            t = getattr(t, "_local_tensor", t)  # a DTensor (FSDP2): this rank's shard
            if type(t) is not torch.Tensor:
                t = t.as_subclass(torch.Tensor)  # a subclass's own bytes, read as a plain tensor
            h.update(f"{t.dtype} {tuple(t.shape)} {t.device.type};".encode())
            if t.device.type == "cpu" and t.is_contiguous() and t.layout == torch.strided:
                if t.numel():
                    h.update(t.view(-1).view(torch.uint8).numpy())
            else:
                device_sums.append(_word_sum(torch, t))
    exact = True
    if device_sums:
        exact = torch.are_deterministic_algorithms_enabled()
        by_device: dict = {}
        for s in device_sums:
            by_device.setdefault(s.device, []).append(s)
        for sums in by_device.values():
            h.update(torch.stack(sums).cpu().numpy().tobytes())
    return h.hexdigest(), exact


def _word_sum(torch, t):
    """A 64-bit sum of the tensor's 32-bit words (16-bit for odd sizes), on its device: any
    changed word changes it, and integer sums are exact in any order."""
    flat = t.contiguous().view(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat.new_zeros(0, dtype=torch.uint8)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw.view(torch.int16) if raw.numel() % 2 == 0 else raw
    return words.sum(dtype=torch.int64)
