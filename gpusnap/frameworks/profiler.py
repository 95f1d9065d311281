"""The torch profiler (``torch.profiler.profile`` with a ``schedule``, stepped by ``prof.step()``).

Its schedule's state is plain Python (``step_num``, ``current_action``), but what it acts on is a
profiling session in C++: started, warming up or recording. The replay's profiler stood at its
setup's step, where the schedule waits, with no session running; the merge gave it the run's
step and action, and nothing started recording. The run's next cycle end then stopped a session
that had never started, and its ``on_trace_ready`` was not called: a program that counts its
traces restarted "verified" with one trace fewer (corpus/scripted.py seed 6; the witness compares
parameters, batches and random states, which a profiler touches none of).

So the snapshot leaves the session (``profiler``), the step's ``record_function`` and the action
out of the profiler's state (the replay's stay), and keeps the run's action beside it, and
whether the run's profiler ran (``start()`` without ``stop()``). After the merge the replay's
session, where it ran, ends without handing a trace over (none of its events are the run's), and
where the run's ran, a session starts at the run's action, as ``start()`` begins one: also where
the run started the profiler in a step the replay skipped (``prof.start()`` at step N; before,
its next step met the snapshot's placeholder of the step's ``record_function`` and the restart
was refused). A trace the restarted process hands over holds the events since the restart only:
the run's earlier events of that cycle were in the killed process.
"""

from __future__ import annotations

import sys

from gpusnap.capture.pickling import pickler
from gpusnap.restore import replay

_PROFILE = "torch.profiler.profiler.profile"
_ACTION = "_gpusnap_action"  # (current_action, _prev_schedule_action, whether it ran) of the run


def _running(profile) -> bool:
    """Whether ``start()`` ran and ``stop()`` did not: it enters a step's ``record_function``
    (with ``record_steps``, the default), or made the session (without)."""
    return (profile.step_rec_fn is not None) if profile.record_steps else (profile.profiler is not None)


def _action(profile) -> dict:
    return {_ACTION: (profile.current_action, getattr(profile, "_prev_schedule_action", profile.current_action),
                      _running(profile))}


def _resume_sessions(objects) -> None:
    profiler = sys.modules.get("torch.profiler.profiler")
    if profiler is None:
        return
    for profile in objects:
        if isinstance(profile, profiler.profile) and _ACTION in profile.__dict__:
            _resume(profiler, profile, *profile.__dict__.pop(_ACTION))


def _resume(profiler, profile, action, schedule_action, ran: bool) -> None:
    Action = profiler.ProfilerAction
    if "profiler" not in profile.__dict__:  # made after setup: no session of the replay's
        profile.profiler, profile.step_rec_fn = None, None
    elif _running(profile):  # the replay's session ends, handing over no trace: none is the run's
        if profile.current_action in (Action.RECORD, Action.RECORD_AND_SAVE):
            profile.stop_trace()
        elif profile.current_action == Action.WARMUP:
            profile.start_trace()
            profile.stop_trace()
        if profile.step_rec_fn is not None:
            profile.step_rec_fn.__exit__(None, None, None)
            profile.step_rec_fn = None
    if ran:  # the run's session, from the start of the run's action, as start() begins one
        profile._transit_action(Action.NONE, action)
        if profile.record_steps:
            profile.step_rec_fn = sys.modules["torch"].autograd.profiler.record_function(f"ProfilerStep#{profile.step_num}")
            profile.step_rec_fn.__enter__()
    profile.current_action, profile._prev_schedule_action = action, schedule_action


pickler.REPLAYED_ATTRS[_PROFILE] = frozenset({"profiler", "step_rec_fn", "current_action", "_prev_schedule_action"})
pickler.EXTRA_STATE[_PROFILE] = _action
replay.AFTER_MERGE["bringing the torch profiler's session to the run's step"] = _resume_sessions
