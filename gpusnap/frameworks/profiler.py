"""The torch profiler (``torch.profiler.profile`` with a ``schedule``, stepped by ``prof.step()``).

Its schedule's state is plain Python (``step_num``, ``current_action``), but what it acts on is a
profiling session in C++: started, warming up or recording. The replay's profiler stood at its
setup's step, where the schedule waits, with no session running; the merge gave it the run's
step and action, and nothing started recording. The run's next cycle end then stopped a session
that had never started, and its ``on_trace_ready`` was not called: a program that counts its
traces restarted "verified" with one trace fewer (corpus/scripted.py seed 6; the witness compares
parameters, batches and random states, which a profiler touches none of).

So the snapshot leaves the session (``profiler``), the step's ``record_function`` and the action
out of the profiler's state (the replay's stay), and keeps the run's action beside it; after the
merge the replay's session is brought from the replay's action to the run's, as the profiler's
own transitions do, but without handing a trace over where the replay's was recording. A trace
the restarted process hands over holds the events since the restart only: the run's earlier
events of that cycle were in the killed process.
"""

from __future__ import annotations

import sys

from gpusnap.capture.pickling import pickler
from gpusnap.restore import replay

_PROFILE = "torch.profiler.profiler.profile"
_ACTION = "_gpusnap_action"  # (current_action, _prev_schedule_action) of the run


def _action(profile) -> dict:
    return {_ACTION: (profile.current_action, getattr(profile, "_prev_schedule_action", profile.current_action))}


def _resume_sessions(objects) -> None:
    profiler = sys.modules.get("torch.profiler.profiler")
    if profiler is None:
        return
    for profile in objects:
        if isinstance(profile, profiler.profile) and _ACTION in profile.__dict__:
            _resume(profiler, profile, *profile.__dict__.pop(_ACTION))


def _resume(profiler, profile, action, schedule_action) -> None:
    none = profiler.ProfilerAction.NONE
    if "profiler" not in profile.__dict__:  # made after setup: no session of the replay's
        profile.profiler, profile.step_rec_fn, profile.current_action = None, None, none
    replayed = profile.current_action
    if replayed in (profiler.ProfilerAction.RECORD, profiler.ProfilerAction.RECORD_AND_SAVE):
        profile.stop_trace()  # (the replay's session: its trace is no trace of the run's)
    elif replayed == profiler.ProfilerAction.WARMUP:
        profile.start_trace()
        profile.stop_trace()
    profile._transit_action(none, action)
    profile.current_action, profile._prev_schedule_action = action, schedule_action
    if profile.record_steps:
        if profile.step_rec_fn is not None:
            profile.step_rec_fn.__exit__(None, None, None)
        profile.step_rec_fn = sys.modules["torch"].autograd.profiler.record_function(f"ProfilerStep#{profile.step_num}")
        profile.step_rec_fn.__enter__()


pickler.REPLAYED_ATTRS[_PROFILE] = frozenset({"profiler", "step_rec_fn", "current_action", "_prev_schedule_action"})
pickler.EXTRA_STATE[_PROFILE] = _action
replay.AFTER_MERGE["bringing the torch profiler's session to the run's step"] = _resume_sessions
