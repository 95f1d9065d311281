"""Lightning Fabric's DataLoader wrapper, tested with lightning 2.6.6.

``fabric.setup_dataloaders(loader)`` returns a ``_FabricDataLoader``: no DataLoader (it holds one,
``_dataloader``, beside a copy of its attributes), whose ``__iter__`` is a generator that, at its
first ``next()``, hands its count of ``iter()`` calls to the sampler's ``set_epoch`` (a
DistributedSampler's order for the epoch), counts one more, and iterates the loader, moving each
batch to the device.

Without an adapter a loop over it was fast-forwarded by consuming its batches: every skipped
batch loaded again, and under a DistributedSampler the count the replay had (it skipped the
earlier epochs' ``iter()`` calls) gave another epoch's order, which the check of the last item
then refused. Here, as for Accelerate's shard, a generator of the wrapper's own is put where the
original stood after yielding n batches: the count is the run's as the loop started, the inner
loader's index sampler skips n - 1 batches (no skipped sample is loaded), and one ``next()`` runs
the generator's start and takes batch n - 1. Anything else (a loader with workers that draw
random numbers, an iterable-style dataset) is consumed, from the run's count too, and checked by
digest, or refused.

Fabric's loop is the program's own: no module needs instrumenting.
"""

from __future__ import annotations

from gpusnap.restore import fastforward

LOADER = "lightning.fabric.wrappers._FabricDataLoader"


def _by_sampler(wrapper) -> bool:
    from torch.utils.data import DataLoader

    inner = getattr(wrapper, "_dataloader", None)
    return isinstance(inner, DataLoader) and fastforward.skips_by_sampler(inner)


class FabricLoaderLoop:
    """A loop over a ``_FabricDataLoader`` (``fastforward.ADAPTERS``)."""

    def describe(self, wrapper) -> dict:
        if not _by_sampler(wrapper):
            return {"kind": "iter", "iter_calls": wrapper._num_iter_calls}
        inner = fastforward.DataLoaderAdapter().describe(wrapper._dataloader)
        return {"kind": "fabric_loader", "iter_calls": wrapper._num_iter_calls, "inner": inner}

    def position(self, wrapper, skip, note, ctx, at):
        if note and "iter_calls" in note:  # (the epoch its iter() hands to a DistributedSampler, consumed or not)
            wrapper._num_iter_calls = note["iter_calls"]
        if not (note and note.get("kind") == "fabric_loader" and _by_sampler(wrapper)):
            return fastforward.consume(wrapper, skip, ctx, at, pure=False)
        return fastforward.wrapper_at(iter(wrapper), wrapper._dataloader, skip, note["inner"], ctx, at), "by batch sampler"


fastforward.ADAPTERS[LOADER] = FabricLoaderLoop()
