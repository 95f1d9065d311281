"""Wrong restores, injected into a restart for the witness tests (tests/test_e2e_witness.py): put
this directory first on PYTHONPATH and name the fault in GPUSNAP_TEST_WRONG_RESTORE.

- ``rng``: the random module's generator is put back one draw further than saved;
- ``batch``: fast-forward skips one batch more of every DataLoader than it should;
- ``ulp``: one parameter is moved by one unit in the last place after the merge;
- ``epoch``: after the merge, each new DataLoader iterator starts one torch draw further (the
  next epoch reshuffles otherwise);
- ``no-fetch-ahead``: the batch accelerate's DataLoaderShard fetched ahead is left out of the
  snapshot (gpusnap before it kept it): the fix switched off, in the run that takes it.

Each patch waits for the module it patches to be imported (a meta path hook), so processes that
never import it (the supervisor, DataLoader workers) pay nothing."""
import importlib.util
import os
import sys

FAULT = os.environ.get("GPUSNAP_TEST_WRONG_RESTORE")


class _After:
    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run, patch = spec.loader.exec_module, self.patch

        def exec_then_patch(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def _rng(module):
    restore = module.restore

    def restore_one_further(states):
        restore(states)
        import random

        random.random()

    module.restore = restore_one_further


def _batch(module):
    iterator_at = module.iterator_at

    def one_more(source, skip, note, ctx=None):
        from torch.utils.data import DataLoader

        return iterator_at(source, skip + 1 if isinstance(source, DataLoader) and skip else skip, note, ctx)

    module.iterator_at = one_more


def _ulp(module):
    def nudge(live_objects):
        import torch

        for obj in live_objects:
            if isinstance(obj, torch.nn.Parameter) and obj.is_floating_point() and obj.numel():
                with torch.no_grad():
                    flat = obj.view(-1)
                    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=obj.dtype))
                return

    module.AFTER_MERGE["nudging a parameter (test)"] = nudge


def _epoch(module):
    def shift_next_epochs(live_objects):
        import torch
        from torch.utils.data import DataLoader

        make = DataLoader.__iter__

        def shifted(self):
            torch.rand(1)
            return make(self)

        DataLoader.__iter__ = shifted

    module.AFTER_MERGE["shifting the next epoch (test)"] = shift_next_epochs


def _no_fetch_ahead(module):
    module.pickler.FETCHED_AHEAD.clear()


PATCHES = {
    "rng": ("gpusnap.graph.rng", _rng),
    "batch": ("gpusnap.restore.fastforward", _batch),
    "ulp": ("gpusnap.restore.replay", _ulp),
    "epoch": ("gpusnap.restore.replay", _epoch),
    "no-fetch-ahead": ("gpusnap.frameworks.accelerate", _no_fetch_ahead),
}
if FAULT in PATCHES:
    sys.meta_path.insert(0, _After(*PATCHES[FAULT]))
