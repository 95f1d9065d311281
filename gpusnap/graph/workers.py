"""Whether the program's DataLoader workers draw random numbers: one byte of anonymous shared
memory that the trainee maps at start and its forked workers inherit.

Fast-forward skips a DataLoader's batches by its index sampler, so no skipped sample is loaded.
With worker processes that is exact only if the workers draw nothing from their global random
generators (torch's, seeded per worker by the loader; ``random``; numpy's) while they fetch: a
skipped batch's draws are never made, and the workers' generators stand elsewhere for the
batches after it (a random flip drawn per sample in ``__getitem__``). The capture agent wraps
torch's dataset fetchers; in a worker each fetch compares the global RNG states before and
after it, and the states of the generators the dataset holds itself (``held_states``: one
made in ``worker_init_fn`` and kept on the dataset or a transform, or a generator among the
globals of the dataset's module), and ``mark``s a change here. The writer records ``seen()``
in the manifest (``workers_draw``), and restore then takes a worker loader's skipped batches
for real. A generator held anywhere else (a closure, another module) is not seen. Workers
started otherwise than by fork (``multiprocessing_context`` spawn or forkserver) run no wrapped
fetch and share no byte: a loader that uses them counts as drawing.

Persistent workers (``persistent_workers=True``) keep their generators from epoch to epoch, so
fresh workers (a restart's) would start an epoch where the original's started the first one. So
each worker, at the first fetch of each epoch (``epoch_started``), leaves its RNG states (torch's,
``random``'s, numpy's global ones and the generators the dataset holds) in a directory private to
the trainee (``DIR``, on /dev/shm), named by the dataset's address, which fork keeps, and the
worker's id. The writer keeps those of the running epoch in the snapshot (``epoch_states``);
restore leaves them for the replay's workers (``put_back``), which take them at their first
fetch of the epoch it resumes, then takes the epoch's batches up to the saved one, as the
original's workers drew them. Where the replay's workers run already, ``put_back`` first waits
for each to have started its running epoch: the states are for the next.
"""

from __future__ import annotations

import atexit
import base64
import mmap
import os
import pickle
import random
import shutil
import sys
import tempfile
import time

from gpusnap import atomic, lifeline
from gpusnap.errors import GpusnapError
from gpusnap.graph import rng
from gpusnap.traverse import walk

_page = None
DIR: str | None = None  # where workers leave their RNG states at each epoch's start
_frozen: dict[str, bytes] = {}  # DIR's states files as the last stall found them (freeze)


def install() -> None:
    """Map the shared byte (the trainee, before any worker forks)."""
    global _page
    if _page is None:
        _page = mmap.mmap(-1, 1)  # anonymous and MAP_SHARED: a forked worker writes the parent's byte


_PREFIX = "gpusnap-workers-"


def make_state_dir() -> None:
    """The directory persistent workers leave their states in (the trainee, before it starts a
    pool of them): made once, removed at exit; those a killed trainee left are removed now."""
    global DIR
    if DIR is not None:
        return
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    for name in os.listdir(shm):
        pid = name[len(_PREFIX):].split("-", 1)[0] if name.startswith(_PREFIX) else ""
        if pid.isdigit() and not lifeline.alive(int(pid)):
            shutil.rmtree(os.path.join(shm, name), ignore_errors=True)
    DIR = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=shm)  # 0700
    atexit.register(_remove, DIR, os.getpid())




def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # not a forked child that runs atexit handlers
        shutil.rmtree(path, ignore_errors=True)


def _key(dataset, worker_id: int) -> str:
    return os.path.join(DIR, f"{id(dataset):x}-{worker_id}")


def epoch_started(dataset, worker_id: int) -> None:
    """In a worker, before the first fetch of an epoch: take the states a restore left for this
    worker, then leave the epoch's starting states for the snapshots."""
    if DIR is None:
        return
    key = _key(dataset, worker_id)
    try:
        with open(key + ".load", "rb") as f:
            saved = pickle.loads(f.read())
        os.unlink(key + ".load")
    except (OSError, pickle.UnpicklingError, EOFError):
        saved = None
    if saved is not None:
        _set_states(dataset, saved)
    try:  # whole or not at all: the writer may read it any time (in /dev/shm: no fsync)
        atomic.write_file(key + ".states", [pickle.dumps(_states(dataset), protocol=pickle.HIGHEST_PROTOCOL)], durable=False)
    except GpusnapError:
        pass  # no room on /dev/shm: the snapshot then holds none, and restart refuses


def freeze() -> None:
    """In the stall: read every worker's epoch states as they are now. The writer reads them
    after the fork, while training goes on, and a worker that starts the next epoch meanwhile
    replaces its file: a snapshot then held the next epoch's states beside this one's position."""
    global _frozen
    if DIR is None:
        return
    frozen = {}
    try:
        names = os.listdir(DIR)
    except OSError:
        names = []
    for name in names:
        if name.endswith(".states"):
            try:
                with open(os.path.join(DIR, name), "rb") as f:
                    frozen[name] = f.read()
            except OSError:
                pass
    _frozen = frozen


def epoch_states(dataset, num_workers: int) -> list[str] | None:
    """The RNG states the workers of ``dataset``'s pool started their running epoch with
    (base64), as the stall found them (``freeze``), or None where one is missing."""
    if DIR is None:
        return None
    found = []
    for worker_id in range(num_workers):
        data = _frozen.get(os.path.basename(_key(dataset, worker_id)) + ".states")
        if data is None:
            return None
        found.append(base64.b64encode(data).decode())
    return found


# How long ``put_back`` waits for running workers to start their epoch (the refusals name it).
START_TIMEOUT_S = 30.0


def put_back(loader, states: list[str], timeout: float = START_TIMEOUT_S) -> bool:
    """Restore: leave ``states`` (``epoch_states``) for the workers of ``loader``'s pool, which
    take them before their next epoch's first fetch. Where its workers run already (the replay
    made its iterator: Lightning's at setup, a program's own peek at a batch), first wait until
    each has started that iterator's epoch: a worker late to its first fetch (a loaded machine)
    would take them there, and start the epoch that counts from its own generators. False, with
    nothing left: one had not started within ``timeout``."""
    if _workers_running(loader) and not _epoch_started(loader.dataset, loader.num_workers, timeout):
        return False
    _leave(loader.dataset, states)
    return True


def _workers_running(loader) -> bool:
    """Whether ``loader`` keeps an iterator whose worker processes run (persistent workers)."""
    it = getattr(loader, "_iterator", None)
    return it is not None and bool(getattr(it, "_workers", None))


def _epoch_started(dataset, num_workers: int, timeout: float) -> bool:
    """Whether each worker of ``dataset``'s pool has left its epoch's starting states, waiting
    up to ``timeout``."""
    if DIR is None:
        return True
    started = [_key(dataset, worker_id) + ".states" for worker_id in range(num_workers)]
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(path) for path in started):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _leave(dataset, states: list[str]) -> None:
    make_state_dir()
    for worker_id, state in enumerate(states):
        key = _key(dataset, worker_id)
        atomic.write_file(key + ".load", [base64.b64decode(state)], durable=False)


def _states(dataset) -> dict:
    torch = sys.modules["torch"]
    mtrand = sys.modules.get("numpy.random.mtrand")
    return {
        "torch": torch.get_rng_state(),
        "random": random.getstate(),
        "numpy": mtrand._rand.get_state(legacy=False) if mtrand is not None else None,
        "held": [rng.owned_state(g) for g in _held(dataset)],
    }


def _set_states(dataset, saved: dict) -> None:
    torch = sys.modules["torch"]
    torch.set_rng_state(saved["torch"])
    random.setstate(saved["random"])
    if saved.get("numpy") is not None:
        import numpy as np

        np.random.set_state(saved["numpy"])
    held = _held(dataset)
    for generator, state in zip(held, saved.get("held") or ()):
        rng.restore_owned_raw(generator, state)


def mark() -> None:
    """Note that workers drew (a worker's fetch; restore, for a snapshot that says so)."""
    install()
    _page[0] = 1


def seen() -> bool | None:
    """Did a worker's fetch draw random numbers (None: not watched in this process)?"""
    return None if _page is None else bool(_page[0])


# How far from the dataset generators are looked for: the dataset's attributes, theirs (a
# transform's), and theirs; containers and objects with more entries than this are passed over.
_DEPTH = 3
_ENTRIES = 64
_PLAIN = (str, bytes, int, float, bool, type(None))


def held_states(dataset) -> list[bytes]:
    """The states of the random generators ``dataset`` holds, in a fixed order (a generator
    made or dropped changes the list too)."""
    return [_comparable(rng.owned_state(g)) for g in _held(dataset)]


def _held(dataset) -> list:
    """The random generators ``dataset`` holds (``held_states``), in a fixed order."""
    found = []

    def expand(obj, depth: int):
        if depth >= _DEPTH or (found and found[-1] is obj):  # a generator: not looked into
            return ()
        if isinstance(obj, (list, tuple)):
            entries = obj
        elif isinstance(obj, dict):
            entries = obj.values()
        else:
            entries = getattr(obj, "__dict__", None)
            entries = entries.values() if isinstance(entries, dict) else ()
        if len(entries) > _ENTRIES:
            return ()
        return [(value, depth + 1) for value in entries if not isinstance(value, _PLAIN)]

    module = sys.modules.get(type(dataset).__module__)
    roots = [(value, _DEPTH) for value in (vars(module).values() if module is not None else ())]
    roots.append((dataset, 0))
    for obj, _depth in walk(roots, expand):
        cls = type(obj)
        generator = _GENERATOR_TYPES.get(cls)
        if generator is None:
            generator = _GENERATOR_TYPES[cls] = _is_generator_type(cls)
        if generator and rng.owned_state(obj) is not None:
            found.append(obj)
    return found


# type -> whether its instances can be generators: a fetch looks at dozens of objects, and
# torch.Generator's isinstance check runs Python code.
_GENERATOR_TYPES: dict[type, bool] = {}


def _is_generator_type(cls: type) -> bool:
    import random

    kinds = [random.Random]
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if np is not None:
        kinds += [np.random.Generator, np.random.RandomState]
    if torch is not None:
        kinds.append(torch.Generator)
    return any(issubclass(cls, kind) for kind in kinds)


def _comparable(state: tuple) -> bytes:
    kind, raw = state
    if kind == "torch.Generator":
        return raw.numpy().tobytes()
    return pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL)
