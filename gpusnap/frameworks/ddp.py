"""DistributedDataParallel: its gradient buckets across a restart.

DDP's reducer all-reduces gradients in buckets, flat buffers laid out first in parameter order
and, from the second iteration of a process on, in the order gradients became ready in the
first (``_rebuild_buckets``). A restarted process is at its first iteration again, so without
help its first step after the restart reduces in the first layout while the uninterrupted run
used the rebuilt one: with more than two ranks the sums come out in another order (last-bit
differences). The snapshot saves the rebuilt layout beside DDP's state (from its logging data,
``rebuilt_per_bucket_param_indices``), and restore gives the replay's DDP a reducer with that
layout, built as DDP builds its own; after the first iteration it rebuilds to the same layout,
since gradients become ready in the same order.
"""

from __future__ import annotations

import sys

from gpusnap.capture.pickling import pickler
from gpusnap.errors import RestoreError
from gpusnap.restore import replay

_ATTR = "_gpusnap_rebuilt_buckets"


def _rebuilt_buckets(ddp) -> dict:
    """The rebuilt bucket layout (lists of parameter indices), once DDP has rebuilt it."""
    try:
        text = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices")
    except Exception:  # noqa: BLE001 - no logger (static graph), another torch: nothing to give
        return {}
    if not text:
        return {}  # not rebuilt yet; an attribute saved before (a restarted process) stays
    return {_ATTR: [[int(i) for i in bucket.split()] for bucket in str(text).split(",")]}


def _give_buckets(objects) -> None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available():
        return
    ddp_type = torch.nn.parallel.DistributedDataParallel
    for ddp in objects:
        if isinstance(ddp, ddp_type) and ddp.__dict__.get(_ATTR) and not ddp.static_graph:
            _rebuild_reducer(ddp, ddp.__dict__[_ATTR])


def _rebuild_reducer(ddp, buckets: list[list[int]]) -> None:
    import torch.distributed as dist

    params, sparse = ddp._build_params_for_reducer()
    if sorted(i for bucket in buckets for i in bucket) != list(range(len(params))):
        raise RestoreError(f"DistributedDataParallel has {len(params)} parameters to reduce, and its gradient buckets in "
                           "the snapshot name others", "restart the program the snapshot was taken of")
    names = ddp._build_debug_param_to_name_mapping(params)
    cap = getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024)

    def assigned(*_args, **_kwargs):
        # DDP hands the reducer these buckets reversed (it assumes gradients come last first).
        return [list(b) for b in reversed(buckets)], [cap] * len(buckets)

    ddp.reducer._remove_autograd_hooks()
    compute = dist._compute_bucket_assignment_by_size
    dist._compute_bucket_assignment_by_size = assigned
    try:
        ddp._ddp_init_helper(params, sparse, names, ddp.static_graph)
    finally:
        dist._compute_bucket_assignment_by_size = compute


pickler.EXTRA_STATE["torch.nn.parallel.distributed.DistributedDataParallel"] = _rebuilt_buckets
replay.AFTER_MERGE["giving DistributedDataParallel its gradient buckets"] = _give_buckets
