"""Merge: write the snapshot's state into the live, replayed objects, in place, by path.

``Merger.value(live, snap, path)`` returns what the place at ``path`` must hold afterwards:

- tensors: the snapshot's bytes copied into the live tensor (and its ``.grad``); a Parameter or
  module buffer whose shape or dtype differs is a ``StateMismatch``, never a silent rebind;
- ``nn.Module`` and other objects with a ``__dict__`` of the same type: their ``__dict__`` merged
  in place, so whatever wraps them (hooks, torch.compile, optimizers) sees restored state;
- lists, dicts (also dicts keyed by objects, such as an optimizer's per-parameter state, whose
  keys are mapped through the alignment built while merging) in place;
- numpy arrays in place; ``random.Random``, numpy ``Generator`` and ``torch.Generator`` by state;
- a live-only placeholder keeps the live object; anything without a live counterpart of the
  same type is taken from the snapshot.

Every snapshot object is merged once (``aligned`` maps it to its live counterpart), so sharing
in the snapshot stays sharing in the live program; two live tensors for one snapshot tensor
means the tying differs, which is an error naming both paths.
"""

from __future__ import annotations

import random
import sys

from gpusnap.capture.pickler import LiveOnly
from gpusnap.errors import StateMismatch

_ATOMS = (str, bytes, int, float, bool, complex, type(None))


class Merger:
    def __init__(self):
        self.aligned: dict[int, object] = {}  # id(snapshot object) -> live object
        self._keep: list = []  # snapshot objects stay alive so their ids stay unique
        self._first_path: dict[int, str] = {}
        self._deferred: list = []
        self.tensors = 0
        self.nbytes = 0
        torch = sys.modules.get("torch")
        self._torch = torch
        self._np = sys.modules.get("numpy")

    def finish(self) -> None:
        """Merge the object-keyed dicts whose keys were not aligned when first met."""
        while self._deferred:
            live, snap, path = self._deferred.pop(0)
            self._merge_dict(live, snap, path, final=True)

    # -- dispatch ------------------------------------------------------------------------
    def value(self, live, snap, path: str):
        if isinstance(snap, LiveOnly):
            return live
        if isinstance(snap, _ATOMS):
            return snap
        done = self.aligned.get(id(snap))
        if done is not None:
            if self._torch is not None and isinstance(snap, self._torch.Tensor) and live is not None and live is not done:
                if isinstance(live, self._torch.nn.Parameter):
                    raise StateMismatch(
                        f"tying differs at {path}: in the snapshot it is the same tensor as {self._first_path[id(snap)]}"
                    )
            return done
        result = self._merge_new(live, snap, path)
        self.aligned[id(snap)] = result
        self._keep.append(snap)
        self._first_path[id(snap)] = path
        return result

    def _merge_new(self, live, snap, path: str):
        torch = self._torch
        if torch is not None and isinstance(snap, torch.Tensor):
            return self._merge_tensor(live, snap, path)
        if live is None or type(live) is not type(snap):
            return snap  # no live counterpart: the snapshot's object goes in
        if isinstance(snap, list):
            return self._merge_list(live, snap, path)
        if isinstance(snap, dict):
            self._merge_dict(live, snap, path)
            return live
        if isinstance(snap, tuple):
            return self._merge_tuple(live, snap, path)
        np = self._np
        if np is not None and isinstance(snap, np.ndarray):
            if live.shape == snap.shape and live.dtype == snap.dtype and live.flags.writeable:
                live[...] = snap
                return live
            return snap
        if isinstance(snap, random.Random):
            live.setstate(snap.getstate())
            return live
        if np is not None and isinstance(snap, np.random.Generator):
            live.bit_generator.state = snap.bit_generator.state
            return live
        if torch is not None and isinstance(snap, torch.Generator):
            live.set_state(snap.get_state())
            return live
        if hasattr(snap, "__dict__") and isinstance(getattr(live, "__dict__", None), dict):
            self._merge_attrs(live, snap, path)
            return live
        return snap

    # -- tensors -------------------------------------------------------------------------
    def _merge_tensor(self, live, snap, path: str):
        torch = self._torch
        if not isinstance(live, torch.Tensor):
            return snap
        if live.shape != snap.shape or live.dtype != snap.dtype:
            if isinstance(live, torch.nn.Parameter) or ("._buffers" in path or ".state[" in path):
                raise StateMismatch(
                    f"{path}: the snapshot holds {tuple(snap.shape)} {snap.dtype}, "
                    f"the program built {tuple(live.shape)} {live.dtype}"
                )
            return snap
        with torch.no_grad():
            live.copy_(snap)
            if snap.grad is None:
                live.grad = None
            elif live.grad is not None and live.grad.shape == snap.grad.shape:
                live.grad.copy_(snap.grad)
            else:
                live.grad = snap.grad.to(live.device)
        self.tensors += 1
        self.nbytes += snap.numel() * snap.element_size()
        return live

    # -- containers ----------------------------------------------------------------------
    def _merge_list(self, live: list, snap: list, path: str):
        merged = [self.value(live[i] if i < len(live) else None, item, f"{path}[{i}]") for i, item in enumerate(snap)]
        live[:] = merged
        return live

    def _merge_tuple(self, live: tuple, snap: tuple, path: str):
        merged = tuple(self.value(live[i] if i < len(live) else None, item, f"{path}[{i}]") for i, item in enumerate(snap))
        if len(merged) == len(live) and all(a is b for a, b in zip(merged, live)):
            return live
        return type(snap)(merged) if type(snap) is tuple else snap

    def _merge_dict(self, live: dict, snap: dict, path: str, final: bool = False) -> None:
        keys = {}
        for key in snap:
            if isinstance(key, _ATOMS) or isinstance(key, type):
                keys[key] = key
            elif id(key) in self.aligned:
                keys[key] = self.aligned[id(key)]
            elif not final:
                self._deferred.append((live, snap, path))
                return
            else:
                raise StateMismatch(f"{path}: a key of this dict ({type(key).__name__}) has no counterpart in the program")
        merged = {}
        for key, value in snap.items():
            live_key = keys[key]
            merged[live_key] = self.value(live.get(live_key), value, f"{path}[{_key_text(key)}]")
        live.clear()
        live.update(merged)

    def _merge_attrs(self, live, snap, path: str) -> None:
        live_attrs = live.__dict__
        snap_attrs = snap.__dict__
        # Object-keyed dicts (optimizer.state) come last: their keys align while the rest merges.
        order = sorted(snap_attrs, key=lambda k: _has_object_keys(snap_attrs[k]))
        for name in order:
            live_attrs[name] = self.value(live_attrs.get(name), snap_attrs[name], f"{path}.{name}")
        for name in [n for n in live_attrs if n not in snap_attrs]:
            del live_attrs[name]


def _has_object_keys(value) -> bool:
    return isinstance(value, dict) and any(not isinstance(k, _ATOMS) for k in value)


def _key_text(key) -> str:
    if isinstance(key, _ATOMS):
        return repr(key)
    return f"<{type(key).__name__}>"
