"""Iterators a snapshot cannot hold: where they stood, and whether the replayed ones stand there.

A generator or a DataLoader iterator in the program's locals or globals is live-only: restart
keeps the one the replayed program built. An iterator that the program advances by hand
(``it = iter(loader)`` before a ``for step in range(n)`` loop whose body calls ``next(it)``, as
the transformers Trainer does) would then sit where the replay left it while the loop around it
is fast-forwarded: a silent divergence. So the writer records, for each live-only iterator,
``capture.trainee.loopnotes.describe(obj)``, and replay (before the merge) runs ``check``:

- a torch DataLoader iterator: its batch count (``_num_yielded``), the base seed it drew when it
  was made, a fingerprint of its index sampler and the RNG states ``iter()`` made it from. A
  replayed one that drew the same seed (then the RNG state at its creation was the same) is
  advanced to the same count (map-style, no workers: through its index sampler, no sample
  loaded; otherwise by taking batches). One made from other random numbers, or already past
  that count (the original made its iterator again in an iteration the replay skipped: ``it =
  iter(loader)`` when the last one ran out), is replaced by a new one from the same DataLoader,
  made from the saved RNG states with an index sampler that skips to the count (no skipped
  sample loaded, by workers either); it must draw the saved seed. Either way its sampler must
  then have the same fingerprint (the last batch of indices).
- a generator: created or finished, the replayed one must be too; suspended, the replayed one
  must have the same fingerprint (position, and every local digested), or, when its code is
  instrumented and the replayed one has not started (the program advances it by hand, ``batches
  = cycle(loader)`` then ``next(batches)`` each step), it is run to the same place: its loops
  fast-forward as a loop on the path does, the innermost to the item before the saved one, and
  one ``next()`` takes that item, which must have the saved item's digest (what the generator
  runs before and between its loops runs again now, and may draw other random numbers). The
  merge then writes the snapshot's values into its locals (``merge``).
- a framework's iterator with an adapter in ``graph.iterators.ADAPTERS`` (an Accelerate
  ``DataLoaderShard``'s generator, Lightning's ``CombinedLoader`` iterator): the adapter describes
  it, and positions the replayed one or replaces it with one it positioned (``Scene.replace``);
- any other iterator: its position is unknown.

Iterators that fast-forward positioned itself (a loop's source) are left alone. What fails is
reported as phrases; replay refuses (``--force``: warns).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import inspect
import re
import sys
import types

from gpusnap.graph.digest import MISSING as _MISSING
from gpusnap.graph.digest import fingerprint, generator_place, loader_iter_class
from gpusnap.graph.iterators import adapter_of_kind, put_generators
from gpusnap.restore.frames import write_locals

HINT = (
    "replay cannot put an iterator that the program advances by hand back where it stood; iterate "
    "it with a for loop (fast-forward positions those), restart from another snapshot with "
    "--snapshot ID, or pass --force to continue anyway"
)

class Scene:
    """What an adapter may use to put a replayed iterator back: ``say``; ``rng_states``, the
    global RNG states (JSON) that the snapshot recorded where loops and their iterations started,
    innermost first (where the original may have started the iterator); ``replace(old, new)``."""

    def __init__(self, say, rng_states, path: str, frames: list, modules: dict):
        self.say, self.rng_states = say, rng_states
        self._path, self._frames, self._modules = path, frames, modules

    def replace(self, old, new) -> str | None:
        """Put ``new`` where the replayed program holds ``old``: at the saved path, and in every
        local of the frames on the path and global of the instrumented modules that is ``old``.
        A problem when something else still holds ``old`` (it would go on with the wrong one)."""
        rebind(self._path, self._frames, self._modules, new)
        # Plain loops: a comprehension would hold ``old`` in a cell, which the check below sees.
        for frame in self._frames:
            names = {}
            for name, value in frame.f_locals.items():
                if value is old:
                    names[name] = new
            if names:
                write_locals(frame, names)
        for namespace in self._modules.values():
            for name, value in list(namespace.items()):
                if value is old:
                    namespace[name] = new
        gc.collect()
        # Frames on the stack (replay's own, the path's) may still name it; any other holder
        # (a container, an object, a suspended generator's frame) would go on with it.
        running = set()
        frame = sys._getframe()
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
        if any(id(holder) not in running for holder in gc.get_referrers(old)):
            return f"cannot replace the iterator at {self._path}: the replayed program holds it in another place too"
        return None


def check(live_only: list, frames: list, modules: dict, positioned: set, say, rng_states=()) -> list[str]:
    """Problems with the replayed program's live-only iterators; DataLoader iterators behind
    their saved position are advanced to it first. ``positioned``: ids fast-forward owns."""
    problems = []
    for entry in live_only:
        info = entry.get("iterator")
        if not info:
            continue
        path = entry["path"]
        live = resolve(path, frames, modules)
        if live is not _MISSING and id(live) in positioned:
            continue
        kind = info.get("kind")
        adapter = adapter_of_kind(kind)
        if adapter is not None:
            scene = Scene(say, list(rng_states), path, frames, modules)
            problem = adapter.check(None if live is _MISSING else live, info, path, scene)
        elif kind == "dataloader_iter":
            problem = position_loader_iter(live, info, path, say, Scene(say, list(rng_states), path, frames, modules))
        elif kind == "generator":
            problem = _generator(live, info, path, say)
        else:
            problem = f"cannot position the iterator at {path} ({entry.get('type')}): a snapshot cannot record where it stood"
        if problem:
            problems.append(problem.replace(" at ?", f" {_NO_PATH}") if path == "?" else problem)
    return problems


# What a refusal says where the capture found no path to the iterator (process.py writes "?").
_NO_PATH = ("inside an object the snapshot rebuilds, where no path reaches it (an itertools.cycle or a zip "
            "holds its iterator so)")


def position_loader_iter(live, info: dict, path: str, say, scene: Scene | None = None) -> str | None:
    """A DataLoader iterator advanced to its saved position (or made again there, ``scene``
    given) and checked there, or a problem."""
    iter_class = loader_iter_class()
    if live is _MISSING or iter_class is None or not isinstance(live, iter_class):
        return f"cannot find the DataLoader iterator that the run that took the snapshot held at {path}"
    other_seed = info.get("base_seed") is not None and getattr(live, "_base_seed", None) != info["base_seed"]
    behind = info["yielded"] - live._num_yielded
    if (other_seed or behind < 0) and scene is not None and info.get("made_with"):
        live, problem = _made_again(live, info, path, scene)
        if problem:
            return problem
        other_seed, behind = False, 0
    if other_seed:
        return f"found the DataLoader iterator at {path} made from other random numbers than in the run that took the snapshot"
    if behind < 0:
        return f"found the DataLoader iterator at {path} {-behind} batches ahead of the run that took the snapshot"
    if behind:
        from torch.utils.data.dataloader import _DatasetKind

        try:
            if live._dataset_kind == _DatasetKind.Map and live._num_workers == 0:
                with _drawing_as_the_run(live, info):
                    for _ in range(behind):
                        live._next_index()  # indices only: no sample is loaded
                live._num_yielded += behind
                how = "through its index sampler"
            else:
                for _ in range(behind):
                    next(live)
                how = "by taking batches"
        except StopIteration:
            return f"found the DataLoader iterator at {path} ending before batch {info['yielded']}"
        say(f"advanced the DataLoader iterator at {path} by {behind} batches {how}")
    saved = info.get("sampler")
    if saved and fingerprint(live._sampler_iter, strict=False) != saved:
        return f"found the DataLoader iterator at {path} with its sampler elsewhere than in the run that took the snapshot"
    return None


@contextlib.contextmanager
def _drawing_as_the_run(live, info: dict):
    """While open, a replay's iterator that has not taken an index yet takes its first one from
    the states the run's took its first from (``first_draw``): an iterator made in setup and
    advanced by hand (one per task of a multi-task run) drew its sampler's seed in an iteration
    the replay skipped. The global states are put back on exit; the loader's generators stay
    where the draws left them, as in the run."""
    first = info.get("first_draw")
    if first is None or live._num_yielded:
        yield
        return
    from gpusnap.graph import rng

    kept = rng.capture()
    _put_states(_loader_of(live), first)
    try:
        yield
    finally:
        rng.restore(kept)


def _loader_of(it):
    """The DataLoader that made iterator ``it`` (``LOADER_ITERS``), or None: unknown, or gone."""
    from gpusnap.graph.iterators import LOADER_ITERS

    made = LOADER_ITERS.get(it)
    return made[0]() if made is not None else None


def _put_states(loader, states: dict) -> None:
    """The global RNG states, and ``loader``'s generators' (None: gone), as a DataLoader
    iterator's ``made_with`` or ``first_draw`` holds them."""
    from gpusnap.graph import rng

    rng.restore_json(states["rng"])
    if loader is not None:
        put_generators(loader, states.get("generator"), states.get("samplers") or [])


def _made_again(live, info: dict, path: str, scene: Scene):
    """(a new iterator of ``live``'s DataLoader, made from the RNG states the original was made
    from and positioned at its batch count, in ``live``'s place; or None), a problem or None."""
    from gpusnap.restore import fastforward

    loader = _loader_of(live)
    if loader is None:
        return None, f"cannot make the DataLoader iterator at {path} again where the run that took the snapshot had made it: its DataLoader is unknown"
    _put_states(loader, info["made_with"])
    by_sampler = fastforward.skips_by_sampler(loader)
    new = fastforward.loader_iterator_at(loader, info["yielded"]) if by_sampler else iter(loader)
    if new._base_seed != info["base_seed"]:
        return None, f"made the DataLoader iterator at {path} again, and it drew another seed than in the run that took the snapshot"
    if by_sampler:
        first = info.get("first_draw")
        if first and info["yielded"]:  # the run took its first batch later than iter(): its order drew from then
            _put_states(loader, first)
        fastforward.start(new)  # (skipping no batch draws nothing)
    else:  # an iterable-style dataset, or workers that draw random numbers: take the batches
        for _ in range(info["yielded"]):
            if next(new, _MISSING) is _MISSING:
                return None, f"made the DataLoader iterator at {path} again, and it ended before batch {info['yielded']}"
    problem = scene.replace(live, new)
    if problem:
        return None, problem
    how = "by batch sampler" if by_sampler else "by taking batches"
    scene.say(f"made the DataLoader iterator at {path} again at batch {info['yielded']} {how}")
    return new, None


def _generator(live, info: dict, path: str, say=None) -> str | None:
    if live is _MISSING or not isinstance(live, types.GeneratorType):
        return f"cannot find the generator that the run that took the snapshot held at {path}"
    state = inspect.getgeneratorstate(live)
    if info.get("context"):  # an entered contextmanager's: the replay's entered the same `with`
        if state == "GEN_SUSPENDED" and generator_place(live) == info["context"]:
            return None
        return (f"found the context manager's generator at {path} {state.lower()[4:]} ({live.gi_code.co_qualname}), "
                f"the run's was suspended at {info['context']}")
    if info["state"] != "GEN_SUSPENDED":
        if state == info["state"]:
            return None
        return f"found the generator at {path} {state.lower()[4:]}, it was {info['state'].lower()[4:]}"
    if info.get("fingerprint") and fingerprint(live, strict=True) == info["fingerprint"]:
        return None
    if info.get("loops") and state == "GEN_CREATED" and live.gi_code.co_qualname == info.get("function"):
        if info["loops"][-1]["kind"] == "while":  # (a `for` inside fast-forwards: _run_generator_to)
            return _consume_generator_to(live, info, path, say)
        return _run_generator_to(live, info, path, say)
    return f"cannot position the generator at {path}: the run that took the snapshot had advanced it by hand"


_CONSUME_MAX = 10_000_000  # items a generator is run by, at most, to reach its saved place


def _consume_generator_to(gen, info: dict, path: str, say) -> str | None:
    """Run a replayed generator of instrumented code whose innermost loop is a ``while`` (an
    endless stream of samples: ``while True: ... yield``), that has not started, item by item until its
    loops stand at the saved iterations: a ``while`` has no iterator to skip with, its bodies
    must run. Only the generator's fingerprint (its position and locals, its own generators'
    states among them) proves that it stands where the saved one stood."""
    from gpusnap.instrument import loops

    if not info.get("fingerprint"):
        return (f"cannot position the generator at {path}: it stood in a `while` loop, and a local it held "
                "could not be digested to prove its place")
    want = {entry["loop_id"]: entry["index"] for entry in info["loops"]}
    outermost = info["loops"][0]["loop_id"]
    frame, taken = gen.gi_frame, 0
    while True:
        if next(gen, _MISSING) is _MISSING:
            return f"cannot position the generator at {path}: it ended after {taken} items, before the place the run that took the snapshot had reached"
        taken += 1
        have = {loop.loop_id: loop.index for loop in loops.ACTIVE if loop.frame is frame}
        if have == want:
            break
        if have.get(outermost, 0) > want[outermost] or taken >= _CONSUME_MAX:
            return f"cannot position the generator at {path}: its loops ran otherwise than in the run that took the snapshot"
    if fingerprint(gen, strict=True) != info["fingerprint"]:
        return f"ran the generator at {path} to its saved place by taking {taken} items, and it stands otherwise than in the run that took the snapshot"
    if say is not None:
        say(f"ran the generator at {path} to its saved place by taking {taken} items")
    return None


def _run_generator_to(gen, info: dict, path: str, say) -> str | None:
    """Run a replayed generator of instrumented code, that has not started, to where the saved
    one stood: its loops fast-forward (``fastforward.iterator_at``), the innermost to the item
    before the saved one; one ``next()`` then takes that item, as the original had."""
    from gpusnap.graph import rng
    from gpusnap.graph.digest import digest
    from gpusnap.instrument import loops
    from gpusnap.restore import fastforward

    saved = {entry["loop_id"]: entry for entry in info["loops"]}
    innermost = info["loops"][-1]
    if innermost["kind"] != "for" or innermost["index"] < 1:
        return f"cannot position the generator at {path}: it stood in a `while` loop, or before its loop's first item"
    frame, previous, ctx, last = gen.gi_frame, loops.on_loop_start, fastforward.Context(), []

    def start(loop, iterable):
        if loop.frame is not frame or loop.loop_id not in saved:
            return previous(loop, iterable) if previous is not None else None
        entry = saved.pop(loop.loop_id)
        skip = max(entry["index"] - 1, 0)
        loop.index = skip
        if loop.kind == "while":
            if entry.get("rng_at"):  # its iteration starts now: with the RNG states it started with
                rng.restore_json(entry["rng_at"])
            return None
        it, _ = fastforward.iterator_at(iterable, skip, entry.get("resume"), ctx)
        if entry is innermost:
            return _remembering(it, last)
        return _starting_with(it, entry["rng_at"]) if entry.get("rng_at") else it

    loops.on_loop_start = start
    try:
        next(gen)
    except StopIteration:
        return f"cannot position the generator at {path}: it ended before the place the run that took the snapshot had reached"
    finally:
        loops.on_loop_start = previous
    if saved or not last:
        return f"cannot position the generator at {path}: its loops ran otherwise than in the run that took the snapshot"
    # The code before and between its loops ran again now, not when the original ran it: only
    # the item it takes again proves that it drew the same (a permutation made in the generator).
    saved_item = info.get("item") or {}
    if not saved_item.get("digest"):
        why = saved_item.get("why") or "none was recorded"
        return f"cannot position the generator at {path}: no digest of the item its loop had taken ({why}) proves where it stands"
    if digest(last[-1])[0] != saved_item["digest"]:
        return f"ran the generator at {path} to its saved place, and it took another item than in the run that took the snapshot"
    if say is not None:
        say(f"ran the generator at {path} to item {innermost['index']} of its loop")
    return None


def _starting_with(it, states: dict):
    """``it``, the RNG states put back once its first item is fetched: where the iteration starts."""
    from gpusnap.graph import rng

    for item in it:
        rng.restore_json(states)
        yield item
        yield from it
        return


def _remembering(it, last: list):
    for item in it:
        last[:] = [item]
        yield item


# -- object paths (capture.trainee.paths writes them) ------------------------------------------------------
_ROOT = re.compile(r"frame\[(\d+)\]\.locals\.(\w+)|globals\[([^\]]+)\]\.(\w+)")
_STEP = re.compile(r"\.(\w+)|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]]*)\]")


def resolve(path: str, frames: list, modules: dict):
    """The live object at ``path`` (``frame[1].locals.self.it``, ``globals[m].x[0]``), or _MISSING."""
    found = _walk(path, frames, modules)
    if found is _MISSING:
        return _MISSING
    obj, steps = found
    try:
        for attr, key in steps:
            obj = getattr(obj, attr) if attr is not None else obj[key]
    except Exception:  # a name the replay does not have
        return _MISSING
    return obj


def rebind(path: str, frames: list, modules: dict, value) -> None:
    """Put ``value`` at ``path`` (which ``resolve`` found) in the replayed program."""
    match = _ROOT.match(path)
    obj, steps = _walk(path, frames, modules)
    if not steps:
        if match.group(1) is not None:
            write_locals(frames[int(match.group(1))], {match.group(2): value})
        else:
            modules[match.group(3)][match.group(4)] = value
        return
    for attr, key in steps[:-1]:
        obj = getattr(obj, attr) if attr is not None else obj[key]
    attr, key = steps[-1]
    if attr is not None:
        setattr(obj, attr, value)
    else:
        obj[key] = value


def _walk(path: str, frames: list, modules: dict):
    """(root object, [(attribute or None, key)]) for ``path``, or _MISSING."""
    match = _ROOT.match(path)
    if match is None:
        return _MISSING
    try:
        if match.group(1) is not None:
            obj = frames[int(match.group(1))].f_locals[match.group(2)]
        else:
            obj = modules[match.group(3)][match.group(4)]
        steps, pos = [], match.end()
        while pos < len(path):
            step = _STEP.match(path, pos)
            if step is None:
                return _MISSING
            pos = step.end()
            steps.append((step.group(1), None if step.group(1) is not None else ast.literal_eval(step.group(2))))
    except Exception:  # a name the replay does not have, a key that is not a literal
        return _MISSING
    return obj, steps
