"""torch.optim optimizers: what their pickled state leaves out.

``Optimizer.__getstate__`` keeps ``defaults``, ``state`` and ``param_groups`` alone, what torch
needs to send a copy elsewhere, and a subclass that does not write its own inherits it: the
attributes the subclass added are left out with whatever they hold. Sharpness-aware
minimization written as people write it wraps a base optimizer in such an attribute
(``tests/programs/corpus/sam_optimizer.py``): the snapshot held none of the base's momentum, and
a restart stepped from the replay's fresh buffers (refused by its witness, 3 of 3). The snapshot
keeps every attribute that a torch optimizer does not set itself, where the class's
``__getstate__`` is torch's (a framework's optimizer class that writes its own decides for
itself).

Its hooks are kept too (``register_step_post_hook`` and the others, in dicts torch sets on each
optimizer): scripts hang an EMA or a weight constraint there once warmup is over, a step the
replay skips. Without them the replay's optimizer stepped without the hook, and an EMA that only
the hook updates (no parameter the witness compares) restarted "verified" to other bytes
(``tests/programs/corpus/optimizer_hooks.py``, 3 of 3; a weight constraint was refused). The
merge makes the replay's dicts the run's, hooks registered in setup included; the ids they are
kept under are the run's (``graph.settings`` keeps torch's counter of them).

Not kept: the wrapper an LR scheduler sets as the optimizer's ``step`` (``_wrapped_by_lr_sched``),
a function made inside the scheduler's ``__init__``, which no snapshot can name. An optimizer and
scheduler made mid-run (a head's, from a phase on) came back with a placeholder for it, and its
first ``step()`` after the restart was refused. Left out, the optimizer keeps the replay's
wrapper where the replay made the scheduler, else its class's ``step``; the wrapper only marks
that the optimizer stepped, for a warning at the scheduler's first step.

torch.ao's sparsifiers copy the optimizers' ``__getstate__`` (``defaults``, ``state``, ``groups``)
and restore it with a bare ``__dict__`` update: one prepared mid-run (gradual pruning after a
dense warm-up) came back without ``enable_mask_update``, ``model`` and ``config``, and its first
``step()`` after a restart was refused. A sparsifier is pickled with its whole ``__dict__``.
"""

from __future__ import annotations

import functools

from gpusnap.capture.pickling import pickler


def _own_attributes(optimizer) -> dict:
    import torch

    if type(optimizer).__getstate__ is not torch.optim.Optimizer.__getstate__:
        return {}
    torch_sets = _set_by_torch()
    return {name: value for name, value in vars(optimizer).items()
            if (name not in torch_sets or name.endswith("_hooks"))
            and not (name == "step" and getattr(value, "_wrapped_by_lr_sched", False))}


@functools.cache
def _set_by_torch() -> frozenset[str]:
    """The attributes ``Optimizer.__init__`` sets, in this torch (the hook dicts change with it)."""
    import torch

    return frozenset(vars(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)))


pickler.EXTRA_STATE["torch.optim.optimizer.Optimizer"] = _own_attributes
pickler.WHOLE_STATE.add("torch.ao.pruning.sparsifier.base_sparsifier.BaseSparsifier")
