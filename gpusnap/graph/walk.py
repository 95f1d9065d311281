"""Walking the object graph: child places in a stable order, and paths that cost O(1) each.

A path is built one suffix at a time (``root + ".model" + "[3]"``) and rendered only when
someone reads it: a structure 100,000 deep would otherwise spend memory quadratic in its depth
on path strings alone. Rendered paths read like Python: ``frame[2].locals.model.fc.weight``,
``globals[__main__].history[3]``, ``...state[<Parameter>]``. The walk itself, each object once
by identity, is ``gpusnap.traverse.walk`` (the floor: stage walks too); ``children`` is what it
goes on with when the whole graph is walked.
"""

from __future__ import annotations

import copyreg
import types

ATOMS = (str, bytes, int, float, bool, complex, type(None))
_MODULE_GROUPS = ("_parameters", "_buffers", "_modules")
_SHOWN_PARTS = 40  # a longer path shows its first and last parts around an ellipsis


class Path:
    """An object's place: its parent's place plus one suffix."""

    __slots__ = ("parent", "suffix", "depth")

    def __init__(self, suffix: str, parent: "Path | None" = None):
        self.parent, self.suffix = parent, suffix
        self.depth = 1 if parent is None else parent.depth + 1

    def __add__(self, suffix: str) -> "Path":
        return Path(suffix, self)

    def suffixes(self):
        """From this place up to the root."""
        node = self
        while node is not None:
            yield node.suffix
            node = node.parent

    def __str__(self) -> str:
        parts = []
        node = self
        while node is not None:
            if len(parts) == _SHOWN_PARTS // 2 and node.depth > _SHOWN_PARTS // 2:
                skipped = node.depth - _SHOWN_PARTS // 2
                while node.depth > _SHOWN_PARTS // 2:
                    node = node.parent
                parts.append(f"...({skipped} more)...")
            parts.append(node.suffix)
            node = node.parent
        return "".join(reversed(parts))

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def slot_values(obj) -> dict:
    """What the ``__slots__`` of ``obj``'s classes hold, by attribute name (a private one as
    mangled; a slot never set left out): state without a ``__dict__`` (``@dataclass(slots=True)``)."""
    if isinstance(obj, type):
        return {}
    values = {}
    for name in copyreg._slotnames(type(obj)):
        try:
            values[name] = object.__getattribute__(obj, name)
        except AttributeError:
            continue
    return values


def key_text(key) -> str:
    if isinstance(key, ATOMS):
        return repr(key)
    return f"<{type(key).__name__}>"


def children(obj, torch_module=None):
    """(suffix, child) pairs of one object, in a stable order: dict items, sequence items, what a
    function's closure cells hold, an nn.Module's parameters, buffers and submodules, then
    ``__dict__`` entries."""
    if isinstance(obj, dict):
        # dict's own items: a subclass's items() may run code (transformers' lazy mappings import
        # a module per key), and a walk must only read.
        for key, value in dict.items(obj):
            yield f"[{key_text(key)}]", value
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
        return
    if type(obj) is types.FunctionType and obj.__closure__:
        for i, cell in enumerate(obj.__closure__):
            try:
                yield f".__closure__[{i}].cell_contents", cell.cell_contents
            except ValueError:  # a variable not bound yet
                continue
    if torch_module is not None and isinstance(obj, torch_module.nn.Module):
        for group in _MODULE_GROUPS:
            for name, value in getattr(obj, group, {}).items():
                if value is not None:
                    yield f".{name}", value
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for name, value in attrs.items():
            if name not in _MODULE_GROUPS:
                yield f".{name}", value
