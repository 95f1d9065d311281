"""Lightning's CombinedLoader iterator (``_ModeIterator``), advanced by hand by the trainer's data
fetcher: the snapshot records where it stood (``ModeIteratorAdapter.describe``) and replay puts
the replayed one there, or says why not (``check``). Real Lightning objects, no trainer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gpusnap.capture.trainee import loopnotes
from gpusnap.frameworks import lightning as adapter_module
from gpusnap.restore import livecheck
from harness import REPO

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

ADAPTER = adapter_module.ModeIteratorAdapter()


def _combined():
    """Lightning's combined_loader, imported when a test runs, not when pytest collects this
    module (each worker collects every module, and importing Lightning takes seconds)."""
    return pytest.importorskip("lightning.pytorch.utilities.combined_loader")


def _scene(say):
    return livecheck.Scene(say, [], "frame[8].locals.it", [], {})


def _loader():
    data = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)


def _started(loaders):
    """A CombinedLoader iterated as the trainer's fetcher does (iter(), then next())."""
    loader = _combined().CombinedLoader(loaders, "max_size_cycle")
    iter(loader)
    return loader._iterator


def test_an_epochs_iterators_are_made_again_at_their_batch_from_the_rng_states_they_were_made_with():
    """Past the first epoch the replay holds the first epoch's iterators; the saved ones were made
    later, from other RNG states. Made again from those states, the next batch is the original's."""
    torch.manual_seed(0)
    loader = _loader()
    _started([loader])  # the first epoch's, as the replay keeps it
    at_iter = torch.get_rng_state()
    original = _started([loader])
    for _ in range(3):
        next(original)
    saved = loopnotes.describe(original)
    expected = next(original)

    torch.manual_seed(5)
    replayed = _started([loader])
    torch.set_rng_state(at_iter)  # where the replayed epoch stands when its step loop starts
    said = []
    assert ADAPTER.check(replayed, saved, "frame[8].locals.it", _scene(said.append)) is None
    assert "again at their saved batches (by batch sampler)" in said[0]
    assert replayed._idx == 3
    got = next(replayed)
    assert got[1:] == expected[1:] and torch.equal(got[0][0][0], expected[0][0][0])


def test_iterators_made_from_other_random_numbers_are_refused():
    torch.manual_seed(0)
    original = _started([_loader()])
    next(original)
    saved = loopnotes.describe(original)
    torch.manual_seed(1)  # the epoch started elsewhere: its base seed cannot match
    replayed = _started([_loader()])
    problem = ADAPTER.check(replayed, saved, "frame[8].locals.it", _scene(lambda _: None))
    assert problem == (
        "found the DataLoader iterator at frame[8].locals.it.iterators[0] made from other random numbers "
        "than in the run that took the snapshot"
    )


def test_a_combined_loader_over_something_else_than_dataloaders_is_refused():
    original = _started([[torch.zeros(2)] * 5])
    next(original)
    saved = loopnotes.describe(original)
    problem = ADAPTER.check(_started([[torch.zeros(2)] * 5]), saved, "frame[8].locals.it", _scene(lambda _: None))
    assert problem == "cannot position the combined loader at frame[8].locals.it: it iterates something other than DataLoaders"


def test_the_adapter_is_found_for_every_mode():
    for mode in ("max_size_cycle", "min_size", "max_size"):
        loader = _combined().CombinedLoader([_loader()], mode)
        iter(loader)
        assert loopnotes.describe(loader._iterator)["kind"] == "lightning_mode_iterator"


def test_loading_the_frameworks_registers_lightning_without_importing_it():
    """Boot loads every framework's support before the program runs: it must cost a program that
    does not use Lightning nothing, so it names Lightning's modules and classes, importing none."""
    probe = (
        "import sys; from gpusnap import frameworks; frameworks.load(); "
        "from gpusnap.capture.pickling import pickler; "
        "assert 'lightning.pytorch.utilities.combined_loader._ModeIterator' in pickler.LIVE_NAMES; "
        "assert 'lightning.pytorch.loops.training_epoch_loop' in frameworks.loop_modules(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'transformers', 'accelerate')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
