"""Objects of classes torch makes at run time, one class per object, which a snapshot makes again
rather than leaving live-only: a module torch's parametrizations gave a class of its own
(`spectral_norm(layer)` makes a ``ParametrizedLinear``), and a torch.fx ``GraphModule`` (each
traced module gets a ``GraphModuleImpl`` of its own).

Other objects of classes pickle cannot name stay live-only (``capture.pickling.pickler``):
restore merges their attributes into the object the replay made at their place. For these two,
that refused every program that parametrizes or traces its model after setup: a discriminator
given spectral normalization once warm-up is over, a model traced with torch.fx and its graph
rewritten (ReLU to GELU) at a phase change. The replay, which skips the steps, held the plain
module there (``tests/programs/corpus/parametrize_late.py``, ``fx_late.py``: refused, 2 of 2).

``reduction`` (the writer's pickler) says how to make one again: the class it was made from
and what torch adds to it, then its attributes. ``alike_attrs`` (the merge) tells when the
replay made one of its own at that place, as the setup made it, and the snapshot's then merges
into it as before.
"""

from __future__ import annotations

import sys

from gpusnap.graph.load import findable


def reduction(obj, torch):
    """A pickle reduction that makes ``obj`` again, or None where it is none of these."""
    if torch is None or not isinstance(obj, torch.nn.Module):
        return None
    (base, *more) = type(obj).__bases__
    if more or not findable(base):
        return None
    if torch.nn.utils.parametrize.is_parametrized(obj):
        return _parametrized_module, (base, tuple(obj.parametrizations.keys())), dict(vars(obj))
    fx = sys.modules.get("torch.fx")
    if fx is not None and base is fx.GraphModule:
        body = {name: value for name, value in vars(obj).items() if name != "_graph"}
        # Made again as torch.fx's own pickling does: the module's last compiled code traced
        # again, over its submodules (the snapshot's). Its attributes after: its hooks, its
        # training flag, which the traced copy would take from a new module.
        code = obj._graph.python_code(root_module="self")
        imports = fx.graph_module._format_import_block(code.globals, fx.graph_module.sys_importer)
        return fx.graph_module.reduce_graph_module, (body, imports), dict(body)
    return None


def _parametrized_module(base: type, names: tuple):
    """An instance of ``base`` given its parametrized class and properties as
    ``torch.nn.utils.parametrize`` gives them; its attributes follow (pickle's BUILD)."""
    import torch.nn.utils.parametrize as parametrize

    obj = base.__new__(base)
    parametrize._inject_new_class(obj)
    for name in names:
        parametrize._inject_property(obj, name)
    return obj


def alike_attrs(live, snap) -> dict | None:
    """The snapshot's attributes to merge into ``live``, where both were made as the same
    kind of object of a class made at run time (the replay's setup parametrized or traced its
    model as the run's did); None where they differ in what their class does."""
    live_type, snap_type = type(live), type(snap)
    if live_type is snap_type or live_type.__qualname__ != snap_type.__qualname__ or live_type.__bases__ != snap_type.__bases__:
        return None
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(snap, torch.nn.Module):
        return None
    parametrize = torch.nn.utils.parametrize
    if parametrize.is_parametrized(snap):
        if not parametrize.is_parametrized(live) or set(live.parametrizations.keys()) != set(snap.parametrizations.keys()):
            return None
        return vars(snap)
    fx = sys.modules.get("torch.fx")
    if fx is not None and isinstance(snap, fx.GraphModule):
        # The replay's runs the code its class was compiled from: the same code, or the snapshot's own module.
        if getattr(live, "_code", None) != snap._code:
            return None
        return {name: value for name, value in vars(snap).items() if name != "_graph"}
    return None
