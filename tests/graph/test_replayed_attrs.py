"""Attributes of a library's objects that a snapshot leaves to the replay
(``pickler.REPLAYED_ATTRS``): references to live objects the replay, which skips the iterations
that made some of them, cannot hold alike. The rest of such an object's state merges as any
object's."""

from __future__ import annotations

import pytest
import torch

from test_graph import merge_into, snapshot_and_load


def test_accelerates_gradient_state_keeps_the_replays_loaders_and_takes_the_runs_flags(tmp_path):
    """Two transformers Trainers in a row: accelerate's one GradientState lists each Trainer's
    loader once per epoch begun, the first Trainer's too, and the run's list is longer than the
    replay's, which passed over the first Trainer's loop. Merging the run's list refused the
    restart (its last weak reference had no counterpart); the replay's is the one whose last
    loader, the one it started again, is what accelerate reads."""
    state = pytest.importorskip("accelerate.state")
    import gpusnap.frameworks.accelerate  # noqa: F401  (registers what the snapshot leaves out)

    first, second = (torch.utils.data.DataLoader(list(range(4))) for _ in range(2))
    gradients = state.GradientState()
    gradients.dataloader_references = [None, first, second]
    gradients.sync_gradients = False
    snap, _ = snapshot_and_load(tmp_path, {"gradients": gradients})

    again = torch.utils.data.DataLoader(list(range(4)))  # the replay's: one loader, started again
    gradients.dataloader_references = [None, again]
    gradients.sync_gradients = True
    live = {"gradients": gradients}
    merged = merge_into(live, snap)

    assert merged["gradients"] is gradients
    assert gradients.active_dataloader is again
    assert gradients.sync_gradients is False, "the run's flag"
