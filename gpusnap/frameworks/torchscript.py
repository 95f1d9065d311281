"""TorchScript modules (``torch.jit.script(model)``, trained as they are): their buffers.

A ``RecursiveScriptModule`` keeps its attributes in its C++ object (``_c``); its ``_buffers`` is
a view of them that the snapshot could not hold (live-only), so a buffer the model updates as
it trains (BatchNorm's running statistics, a running mean of its inputs) came back as the
replay had made it, and the witness refused the restart (the parameters after the first step
differed). Its parameters are reached through its submodules and the optimizer, and need
nothing. So the snapshot keeps each scripted module's buffers beside its state, and once merged
they are copied into the replay's module.

TorchScript's executor (on by default) profiles a graph's first calls in a process and then runs
an optimized graph, whose last bits differ: a restarted process runs the profiling calls again
where the run ran the optimized graph. The witness caught that while it held enough iterations
(8 of 8), and said "verified" with one (corpus/scripted.py --jit-optimize, other bytes, 3 of 3
on a faster machine). So a snapshot taken while the executor optimizes (the flag
``torch.jit.optimized_execution`` sets, in the snapshot's thread) is refused at its restart, by
name; inside ``optimized_execution(False)`` it restarts exactly.

A TorchScript module made in a step (``torch.jit.trace(model, x)`` once warm-up is over, kept
to evaluate with) has nothing the replay made at its place, and its C++ object (which shares the
eager model's parameters) is none a snapshot can hold: such a restart is refused, by name
(``tests/programs/corpus/jit_trace_late.py``; it failed inside gpusnap, "please report this").
"""

from __future__ import annotations

import sys

from gpusnap.capture.pickling import pickler
from gpusnap.errors import StateMismatch
from gpusnap.graph.load import LiveOnly
from gpusnap.restore import replay

_SCRIPTED = "torch.jit._script.RecursiveScriptModule"
_BUFFERS = "_gpusnap_buffers"
_OPTIMIZED = "_gpusnap_optimized"  # whether TorchScript's executor optimized graphs at the snapshot


def _buffers(module) -> dict:
    try:
        kept = {_BUFFERS: {name: tensor for name, tensor in module._buffers.items() if tensor is not None}}
    except Exception:  # noqa: BLE001 - a scripted module without a C++ object: nothing more to keep
        return {}
    optimizing = getattr(sys.modules["torch"]._C, "_get_graph_executor_optimize", None)
    kept[_OPTIMIZED] = bool(optimizing()) if optimizing is not None else False
    return kept


def _give_buffers(objects) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    objects = list(objects)
    for module in objects:  # first: the rest of a module made after setup is moot
        if isinstance(module, torch.jit.ScriptModule) and isinstance(module.__dict__.get("_c"), LiveOnly):
            raise StateMismatch(
                f"the snapshot holds a TorchScript module ({type(module).__name__}) that the program made after setup, "
                "in a step the replay skips: its compiled object, which shares the model's parameters, is none a snapshot "
                "can hold",
                "trace or script the model before the training loop (the replay then does it again), or evaluate with the "
                "eager module")
    for module in objects:
        if isinstance(module, torch.jit.RecursiveScriptModule) and module.__dict__.pop(_OPTIMIZED, False):
            raise StateMismatch(
                f"the snapshot holds the TorchScript module {module.original_name}, run under TorchScript's optimizing "
                "executor, which optimizes each graph after its first calls in a process: the restarted process would run "
                "other graphs than the run did from there, with other last bits (a witness of a few iterations may not see it)",
                "run the training loop inside torch.jit.optimized_execution(False), or train the eager module")
        if isinstance(module, torch.jit.RecursiveScriptModule) and _BUFFERS in module.__dict__:
            for name, saved in module.__dict__.pop(_BUFFERS).items():
                live = module._buffers[name] if name in module._buffers else None
                if live is None or live.shape != saved.shape or live.dtype != saved.dtype:
                    raise StateMismatch(f"the scripted module's buffer {name!r} is {tuple(saved.shape)} {saved.dtype} in the "
                                        f"snapshot, {'absent' if live is None else f'{tuple(live.shape)} {live.dtype}'} in the replay")
                if live is not saved:
                    with torch.no_grad():
                        live.copy_(saved)


pickler.EXTRA_STATE[_SCRIPTED] = _buffers
replay.AFTER_MERGE["putting back the buffers of TorchScript modules"] = _give_buffers
