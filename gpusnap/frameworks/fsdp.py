"""FSDP2 (``torch.distributed.fsdp.fully_shard``): what a snapshot keeps of a sharded model.

The training state is the parameters (DTensors: each rank's shard, captured and merged by
``capture.pickling.pickler`` and ``restore.merge``) and the optimizer's state (DTensors too). The rest is
FSDP's runtime: its per-module state, parameter groups and hooks, made partly by ``fully_shard``
in setup and partly at the first forward (lazy initialization), keyed by handle ids that depend
on that order. A restart keeps the replay's runtime, as a fresh run would have it, and the first
forward after the merge initializes it as it always does; the restored shards are the same
tensors FSDP's parameters already view, so it all-gathers restored weights.
"""

from __future__ import annotations

from gpusnap.capture.pickling import pickler

# FSDP's runtime objects: kept as the replay built them (reached only through hooks).
pickler.LIVE_NAMES.update({
    "torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState",
    "torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup",
    "torch.distributed.fsdp._fully_shard._fsdp_param.FSDPParam",
})
# An FSDP module's hooks: registered by fully_shard and by lazy initialization, the replay's.
_HOOKS = frozenset({
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
})
for name in ("torch.distributed.fsdp.FSDPModule", "torch.distributed.fsdp._fully_shard._fully_shard.FSDPModule"):
    pickler.REPLAYED_ATTRS[name] = _HOOKS
