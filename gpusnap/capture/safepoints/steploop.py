"""Which loop is the step loop, and which boundaries are safe points.

The step loop is the innermost loop running when an optimizer step starts (learned at torch's
pre-step hook, so that LBFGS's closure, which runs the model from inside ``step()``, never makes
a loop in ``forward`` look like it), or the loop ``--at`` names. While it runs, only its own
boundaries are safe points; while none runs (setup, evaluation) any main-thread boundary serves.
Either way a safe point must be a place replay can return to (``safepoints.returnable``).

The optimizer hooks also count steps and iterations, ready the staging memory after a writer
(``stage.prepare``), and, at the first step, say once when the step loop is in code gpusnap does
not instrument. Loops start with a fast-forward note (``describe_source``), except inside a
running step loop's body, where no snapshot can be taken before they end (a generator's loops
excepted: the generator outlives the body that advanced it).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import weakref

from gpusnap import knobs, stage
from gpusnap.capture.safepoints import returnable as safepoints
from gpusnap.capture.trainee import costs, session, witness
from gpusnap.graph import iterators, rng, workers
from gpusnap.instrument import loops
from gpusnap.onimport import after_import

# (id(code), loop_id) -> code: ids hash in nanoseconds, a code object's hash is recomputed (about
# 1 us) at every lookup; holding the code keeps its id its own.
_step_loops: dict = {}
_last_stepping = (lambda: None, -1)  # (weak ActiveLoop, index) of the last iteration counted
# The most iterations of one step loop seen from one stepping iteration to the next: above 1, the
# program accumulates gradients (or losses) over several iterations per step (``in_accumulation``).
_widest_gap = 1
_ACCUMULATION_MAX = 16  # a snapshot waits for at most this many iterations to the next step
_note_source = None  # restore's fastforward.describe, handed over by boot through the agent
_stepper_checked = False  # the first optimizer step looked for a step loop gpusnap cannot reach
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
_in_child = False  # a forked child of the trainee (the program's own processes, DataLoader workers)
# Loops that stepped an optimizer and ended, each with the running loops it ran inside and their
# iterations then: (entry, ((weak ActiveLoop, index), ...)). Those whose enclosing loops are all
# still in the same iteration are the training phases a replay must not run again.
_finished: list = []
# (id(code), loop_id) -> (code, iterations of its last complete run): the code is held so that its id stays its own
_lengths: dict = {}


def install(note_source) -> None:
    global _note_source
    _note_source = note_source
    os.register_at_fork(after_in_child=_forked)
    loops.describe_source = describe_source
    loops.on_loop_end = loop_ended
    loops.capture_rng = rng.compact
    loops.note_start = note_start
    after_import("torch.optim.optimizer", _hook_optimizers)
    after_import("torch.utils.data.dataloader", _note_loader_iters)
    workers.install()
    after_import("torch.utils.data._utils.fetch", _note_worker_draws)


def _forked() -> None:
    global _in_child
    _in_child = True


def _hook_optimizers(module) -> None:
    module.register_optimizer_step_pre_hook(_before_optimizer_step)
    module.register_optimizer_step_post_hook(_after_optimizer_step)


def _note_loader_iters(module) -> None:
    """Every ``iter(loader)`` notes the RNG states it starts from, and its first index the states
    its sampler draws its order from (``iterators.LOADER_ITERS``)."""
    loader_iter = module.DataLoader.__iter__

    @functools.wraps(loader_iter)
    def __iter__(self):
        if self.num_workers > 0 and not workers.seen() and _start_method(self) != "fork":
            workers.mark()  # workers gpusnap does not start in (spawn, forkserver) are not watched
        witness.loader_made()
        if self.persistent_workers and self.num_workers > 0:
            workers.make_state_dir()  # before its workers fork: they leave their RNG states there
        made_with = _loader_states(self)
        it = loader_iter(self)
        try:
            iterators.LOADER_ITERS[it] = (weakref.ref(self), made_with, [None])
        except TypeError:  # an iterator that takes no weak reference: nothing to make again
            pass
        return it

    module.DataLoader.__iter__ = __iter__

    loader_next_index = module._BaseDataLoaderIter._next_index

    @functools.wraps(loader_next_index)
    def _next_index(self):
        if not self._num_yielded:  # (a worker iterator's prefetch at iter() too: the same states)
            _note_first_draw(self)
        return loader_next_index(self)

    module._BaseDataLoaderIter._next_index = _next_index

    loader_next = module._BaseDataLoaderIter.__next__

    @functools.wraps(loader_next)
    def __next__(self):
        batch = loader_next(self)
        witness.fetched(batch)  # the iterations after a snapshot: what they consume
        return batch

    module._BaseDataLoaderIter.__next__ = __next__


def _loader_states(loader) -> tuple:
    """The global RNG states, the loader's generator's and its samplers' (``iterators.LOADER_ITERS``)."""
    return (rng.compact(), loader.generator.get_state() if loader.generator is not None else None,
            iterators.sampler_generators(loader))


def _note_first_draw(it) -> None:
    """A RandomSampler draws its order's seed at its first ``next()``, not at ``iter()``: an
    iterator made in setup and advanced by hand inside the loop (one per task of a multi-task
    run) drew it from the states of that iteration, which a replay that skips it never has."""
    made = iterators.LOADER_ITERS.get(it)
    if made is not None and made[2][0] is None:
        loader = made[0]()  # (an iter(DataLoader(...)) holds no loader: the global states alone)
        made[2][0] = _loader_states(loader) if loader is not None else (rng.compact(), None, [])


def _start_method(loader) -> str:
    import multiprocessing

    return (loader.multiprocessing_context or multiprocessing.get_context()).get_start_method()


def _note_worker_draws(module) -> None:
    """In a DataLoader worker, a fetch that changes the global RNG states or a generator the
    dataset holds is noted (``graph.workers``): fast-forward cannot skip such a loader's
    batches by index."""
    for cls in (module._MapDatasetFetcher, module._IterableDatasetFetcher):
        fetch = cls.fetch

        @functools.wraps(fetch)
        def watched(self, possibly_batched_index, _fetch=fetch):
            # Imported while torch.utils.data initializes: its worker module is loaded by now.
            info = sys.modules["torch.utils.data._utils.worker"].get_worker_info()
            if info is None:  # the main process: the snapshot holds its RNG states
                return _fetch(self, possibly_batched_index)
            if "_gpusnap_epoch" not in vars(self):  # a worker makes a fetcher per epoch
                self._gpusnap_epoch = True
                workers.epoch_started(self.dataset, info.id)
            before, held = rng.compact(), workers.held_states(self.dataset)
            data = _fetch(self, possibly_batched_index)
            if not rng.same(before, rng.compact()) or workers.held_states(self.dataset) != held:
                workers.mark()
            return data

        cls.fetch = watched


def _before_optimizer_step(optimizer, *_):
    """Before the step runs (LBFGS's closure calls the model from inside it): know the step loop,
    so that no boundary inside the step is taken for a safe point."""
    global _last_stepping, _widest_gap
    if _in_child:
        return  # a process the program forked (Hogwild's trainers): none of gpusnap's business
    if loops.replaying is not None:
        loops.replaying()
    for i in range(len(loops.ACTIVE) - 1, -1, -1):
        loop = loops.ACTIVE[i]
        if loop.frame.f_back is not None:  # a suspended generator's frame has no caller
            code = loop.frame.f_code
            _step_loops[(id(code), loop.loop_id)] = code
            mark_enclosing(i)
            for running in loops.ACTIVE[: i + 1]:
                running.stepped = True
            if _last_stepping[0]() is not loop or _last_stepping[1] != loop.index:
                session.iterations += 1  # the GAN's second optimizer in the same iteration does not count
                costs.iteration()
                if _last_stepping[0]() is loop:
                    _widest_gap = max(_widest_gap, min(loop.index - _last_stepping[1], _ACCUMULATION_MAX))
                _last_stepping = (weakref.ref(loop), loop.index)  # never keeps a frame alive
            break
    if not _stepper_checked:
        _check_stepper(sys._getframe(1))


def _after_optimizer_step(optimizer, *_):
    if _in_child:
        return
    session.steps += 1
    witness.stepped(optimizer)
    if optimizer not in session.optimizers:
        session.optimizers.add(optimizer)
        session.prepared = False  # its state exists from its first step on
    if not session.prepared and session.writer is None and session.config.get("run_dir") and knobs.DRAIN != "off":
        session.prepared = True  # until a new optimizer steps or a writer has finished
        stage.prepare(list(session.optimizers), session.windows_nbytes)


def loop_ended(loop) -> None:
    """``loops.on_loop_end``: every loop's length is noted (``last_length``). A loop that stepped
    an optimizer ran its course (a teacher's training before the student's, a learning-rate
    range test before the real loop, last epoch's batches): noted with where it ran, so that a
    snapshot can name the finished phases that its replay must pass over."""
    if _in_child:
        return
    code = loop.frame.f_code
    _lengths[(id(code), loop.loop_id)] = (code, loop.index)
    if not getattr(loop, "stepped", False):
        return
    if code.co_flags & _GENERATOR_FLAGS:
        return  # a generator's loop ends when the generator is done with, not where it stands
    within = tuple((weakref.ref(other), other.index) for other in loops.ACTIVE if other.frame.f_back is not None)
    _finished[:] = [done for done in _finished if _still_within(done[1])]
    _finished.append(({"file": code.co_filename, "function": code.co_qualname, "loop_id": loop.loop_id, "ran": loop.index}, within))


def last_length(loop) -> int | None:
    """The iterations of ``loop``'s statement's last complete run in this process, None before
    one ended (a distributed plan does not target an index that such a short loop never reaches)."""
    noted = _lengths.get((id(loop.frame.f_code), loop.loop_id))
    return None if noted is None else noted[1]


def finished_loops() -> list:
    """The loops that stepped and ended within the current iterations of the loops running now,
    in the order they ended: a replay runs each of them zero times (the merge brings what they
    made). One that ended in an earlier iteration of a running loop is passed over with it."""
    return [entry for entry, within in _finished if _still_within(within)]


def _still_within(within) -> bool:
    for ref, index in within:
        loop = ref()
        if loop is None or loop.index != index or not any(running is loop for running in loops.ACTIVE):
            return False
    return True


def mark_enclosing(i: int) -> None:
    """The running loops outside ``ACTIVE[i]`` record their RNG states at each iteration start
    from now on (fast-forward gives them back to the body prefix it reruns)."""
    for loop in loops.ACTIVE[:i]:
        if type(loop) is loops.ActiveLoop and loop.frame.f_back is not None:
            loop.__class__ = loops.EnclosingLoop


def note_start(loop) -> None:
    """``loops.note_start``: the scalar locals a loop starts with, which its first iteration
    starts with too. A loop becomes an ``EnclosingLoop``, which records them at each iteration
    start, only at the first optimizer step inside it, after its first iteration's prefix ran:
    a snapshot in that iteration had none, and the replay's prefix ran with its own. Where the
    replay's setup went another way than the run's, that was another call: a transformers
    example script that looks for its last checkpoint at start found the one the run saved
    before the snapshot, and `_run_epoch(resume_from_checkpoint=..., steps_trained_in_current_epoch=10)`
    skipped the batches the run had taken (refused, 2 of 4: "its DataLoader has 3 batches, the run
    that took the snapshot had taken 11"; corpus/hf_example_resume.py). Not for loops inside a
    step loop's body (they end before its next safe point), nor in a generator."""
    if loop.frame.f_code.co_flags & _GENERATOR_FLAGS or _inside_step_body(loop):
        return
    loop.locals_at, loop.locals_for = loops.scalar_locals(loop.frame), 1


def describe_source(loop, source):
    """``loops.describe_source``: the fast-forward note of a loop that may be on a snapshot's
    path. A loop that starts inside a running step loop's body ends before that loop's next
    boundary, the only safe point while it runs, so it needs none (unless it is a step loop
    itself): this keeps the cost of taking RNG states out of training steps."""
    if _inside_step_body(loop):
        return None
    try:
        note = _note_source(source)
    except Exception:  # an adapter that cannot read this source: consumed, and checked, on replay
        return {"kind": "iter", "rng": rng.compact()}
    if note is not None and (found := iterators.loaders_in(source)):
        loop.loaders = found  # held while the loop runs: an inline DataLoader(...) lives no longer
    return note


def _inside_step_body(loop) -> bool:
    if not _step_loops and not session.config.get("at"):
        return False
    if loop.frame.f_code.co_flags & _GENERATOR_FLAGS:
        return False  # a generator's loop outlives the body that advanced it (livecheck runs it again)
    if is_step_loop(loop):
        return False
    for other in loops.ACTIVE:
        if is_step_loop(other) and other.frame.f_back is not None:
            return True
    return False


def _at_matches(loop) -> bool:
    at = session.config.get("at")
    if not at:
        return False
    file, _, line = at.rpartition(":")
    code_file = loop.frame.f_code.co_filename
    return loop.loop_id.split(":")[0] == line and (code_file == file or code_file.endswith("/" + file.lstrip("./")))


def _check_stepper(frame) -> None:
    """Once, at the first optimizer step: if a loop in code gpusnap does not instrument (a
    framework's trainer) runs the steps, say so now, not when a snapshot never comes."""
    global _stepper_checked
    _stepper_checked = True
    coroutine = safepoints.coroutine_on_path(frame)
    if coroutine is not None:
        print(
            f"gpusnap: the optimizer steps inside a coroutine at {coroutine}, which an event loop drives: no snapshot "
            "can be taken there (replay cannot bring suspended coroutines back); run the training loop in plain "
            "functions, outside the event loop",
            file=sys.stderr,
            flush=True,
        )
        return
    found = safepoints.uninstrumented_step_loop(frame)
    if found is not None:
        where, modules = found
        option = " ".join(f"--instrument {module}" for module in modules)
        print(
            f"gpusnap: the optimizer steps inside a loop at {where}, which gpusnap does not instrument: "
            f"a snapshot waits for a loop boundary of your own code ({option} instruments the way there)",
            file=sys.stderr,
            flush=True,
        )


def step_loop_keys() -> list:
    """The step loops seen so far, as (file, function, "LINE:COL") (what the witness watches)."""
    return [[code.co_filename, code.co_qualname, loop_id] for (_, loop_id), code in _step_loops.items()]


def is_step_loop(loop) -> bool:
    return (id(loop.frame.f_code), loop.loop_id) in _step_loops or _at_matches(loop)


def in_accumulation(loop) -> bool:
    """Whether the step loop's iteration that just ended took no optimizer step inside a window of
    iterations that ends with one, as the program's steps so far came (gradient accumulation).
    Its state then may hold what a snapshot cannot: a sum of losses whose autograd graph the
    window's step will backward through (``window = window + loss``). A restart from there
    lost those iterations' gradients, and its witness refused it. A snapshot waits for the
    window's step, at most ``_ACCUMULATION_MAX`` iterations."""
    ref, last = _last_stepping
    return _widest_gap > 1 and ref() is loop and 0 < loop.index - last < _widest_gap


def is_safe_point(loop) -> bool:
    if not safepoints.returnable(loop.frame):
        return False
    if is_step_loop(loop):
        return True
    # A step loop further out is running: wait for its own boundary.
    return not any(is_step_loop(other) and other.frame.f_back is not None for other in loops.ACTIVE)
