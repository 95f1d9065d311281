"""A local function the run made in a step the replay skipped, made again from its code.

A hook registered at a phase change (``layer.register_forward_hook(lambda m, i, out: out *
scale)``), a ``LambdaLR`` made for a fine-tuning phase: the snapshot holds such a function as a
``graph.load.LiveFunction``, and the replay, which did not run that step, holds nothing at its
place. The function is data-free apart from its cells, defaults and attributes, so it can be
made again, exactly, from three things:

- its code: found in the replay by qualified name and first line, inside the code of a frame on
  the path, or of the function or class its qualified name starts with in its module; the
  replay runs the snapshot's own sources, so it is the run's code;
- its globals: that frame's, or that module's;
- its cells. A cell the function shared with a frame on the snapshot's path (``scale`` above,
  which the loop rebinds every step) is that frame's in the replay (``instrument.transform``
  keeps a frame's cells reachable); a cell it shared with another local function is that one's
  (``shared``, by the run's cell id); any other is a new cell, which the merge fills with what the
  snapshot's held. A copy of a frame's cell would read a value the loop never updates.

Where one of these cannot be found (the code of a source that changed, a frame cell the
replay's frame lacks), nothing is made: the merge then refuses as before.
"""

from __future__ import annotations

import sys
import types

from gpusnap.graph import roots
from gpusnap.graph.load import LiveFunction


def make_again(snap: LiveFunction, frames: list, shared: dict[int, object]) -> types.FunctionType | None:
    """The function ``snap`` stands for, made from the replay's code over ``frames`` (the
    replay's frames on the path, outermost first) and ``shared`` ({the run's cell id: the live
    cell}); None where it cannot be. Its cells that hold no frame's or shared variable are new
    and empty; its defaults are not set (the merge sets both from the snapshot)."""
    if snap.line is None:  # (a snapshot older than the first line kept)
        return None
    on_frames = snap.made.get("frames", {})
    found = _code_of(snap, [frames[i] for i in sorted(set(on_frames.values())) if i < len(frames)], frames)
    if found is None:
        return None
    code, namespace = found
    cell_ids = snap.made.get("cell_ids", {})
    frame_cells = {i: roots.cells_of(frames[i]) if i < len(frames) else {} for i in set(on_frames.values())}
    closure = []
    for name in code.co_freevars:
        if name in on_frames:
            cell = frame_cells[on_frames[name]].get(name)
        else:
            cell = shared.get(cell_ids.get(name), types.CellType())
        if cell is None:
            return None
        closure.append(cell)
    made = types.FunctionType(code, namespace, code.co_name, None, tuple(closure) or None)
    if names := snap.made.get("names"):  # a decorator's wrapper (functools.wraps): the wrapped function's
        made.__name__, made.__qualname__, made.__module__, made.__doc__ = names
    for name, cell in zip(code.co_freevars, closure):
        if name in cell_ids:
            shared.setdefault(cell_ids[name], cell)  # the next function made over this cell shares it
    return made


def _code_of(snap: LiveFunction, sharing: list, frames: list):
    """(code, globals) of ``snap``'s function: searched in the frames it shares cells with, then
    in the definition its qualified name starts with (``main`` of ``main.<locals>.<lambda>``),
    then in every frame on the path."""
    for frame in sharing:
        if (code := _find(frame.f_code, snap)) is not None:
            return code, frame.f_globals
    module = sys.modules.get(snap.made.get("module", ""))
    outer = _definition(module, snap.qualname.split(".<locals>.")[0]) if module is not None else None
    if outer is not None and (code := _find(outer, snap)) is not None:
        return code, vars(module)
    for frame in reversed(frames):
        if (code := _find(frame.f_code, snap)) is not None:
            return code, frame.f_globals
    return None


def _definition(module, dotted: str):
    """The code of the function ``dotted`` names in ``module`` (a method of a class, unwrapped
    from staticmethod, classmethod and ``functools.wraps`` decorators); None where there is none."""
    obj = module
    for part in dotted.split("."):
        obj = (vars(obj) if isinstance(obj, type) else getattr(obj, "__dict__", {})).get(part)
        if obj is None:
            return None
    for _ in range(8):  # (a decorator's wrapper keeps what it wraps in __wrapped__)
        obj = getattr(obj, "__func__", obj)
        if isinstance(obj, types.FunctionType) and not hasattr(obj, "__wrapped__"):
            break
        obj = getattr(obj, "__wrapped__", obj)
    return getattr(obj, "__code__", None)


def _find(code: types.CodeType, snap: LiveFunction) -> types.CodeType | None:
    todo = [code]
    while todo:
        code = todo.pop()
        if code.co_qualname == snap.qualname and code.co_firstlineno == snap.line:
            return code
        todo.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return None
