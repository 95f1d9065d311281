"""TorchScript modules (``torch.jit.script(model)``, trained as they are): their buffers.

A ``RecursiveScriptModule`` keeps its attributes in its C++ object (``_c``); its ``_buffers`` is
a view of them that the snapshot could not hold (live-only), so a buffer the model updates as
it trains (BatchNorm's running statistics, a running mean of its inputs) came back as the
replay had made it, and the witness refused the restart (the parameters after the first step
differed). Its parameters are reached through its submodules and the optimizer, and need
nothing. So the snapshot keeps each scripted module's buffers beside its state, and once merged
they are copied into the replay's module.
"""

from __future__ import annotations

import sys

from gpusnap.capture.pickling import pickler
from gpusnap.errors import StateMismatch
from gpusnap.restore import replay

_SCRIPTED = "torch.jit._script.RecursiveScriptModule"
_BUFFERS = "_gpusnap_buffers"


def _buffers(module) -> dict:
    try:
        return {_BUFFERS: {name: tensor for name, tensor in module._buffers.items() if tensor is not None}}
    except Exception:  # noqa: BLE001 - a scripted module without a C++ object: nothing more to keep
        return {}


def _give_buffers(objects) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for module in objects:
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
