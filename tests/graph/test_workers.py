"""Persistent DataLoader workers given back the generators an epoch started with (graph/workers.py).

A restore leaves each worker the states the original's started the snapshot's epoch with
(``put_back``); a worker takes them at its next epoch's first fetch. Where the replay's workers
run already (Lightning makes its training loader's iterator at setup), a worker late to its first
fetch takes them there, and then starts the epoch that counts from its own generators:
``put_back`` first waits for each to have started. The scene runs in a subprocess
of its own: the fetch hook it installs is process-wide. A worker is made late by a
``worker_init_fn`` that sleeps."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import _env

SCENE = r"""
import base64, os, pickle, random, sys, time
import numpy as np
import torch
import torch.utils.data._utils.fetch as fetch
from gpusnap.capture.safepoints import steploop
from gpusnap.graph import workers

steploop._note_worker_draws(fetch)  # what the trainee's agent installs
workers.install()
workers.make_state_dir()  # (DataLoader.__iter__, hooked, makes it for a persistent loader)


class Draws(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor(np.random.random())


def late(worker_id):
    time.sleep(float(sys.argv[2]))


dataset = Draws()
loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True, worker_init_fn=late)
stale = iter(loader)  # the replay's iterator, made before the merge: its workers start
np.random.seed(123)
torch.manual_seed(5)
random.seed(7)
left = base64.b64encode(pickle.dumps(workers._states(dataset))).decode()  # what the epoch started with
expected = np.random.random(4)
if sys.argv[1] == "wait":
    assert workers.put_back(loader, [left, left])
else:
    workers._leave(dataset, [left, left])  # what put_back did before it waited
it = iter(loader)  # the reset that starts the snapshot's epoch
first, second = next(it), next(it)  # one from each worker, each from the states left
print(np.allclose(first.numpy(), expected), np.allclose(second.numpy(), expected))
"""


def scene(how: str, late_s: float) -> str:
    done = subprocess.run([sys.executable, "-c", SCENE, how, str(late_s)], capture_output=True, text=True, timeout=120,
                          env=_env())
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("late_s", [0.0, 1.0], ids=["prompt workers", "late workers"])
def test_persistent_workers_take_the_states_left_for_them_at_the_reset(late_s):
    assert scene("wait", late_s) == "True True"


def test_without_the_wait_a_late_worker_takes_them_too_early():
    """The race the wait closes, shown: it is real, so the test above can fail."""
    assert scene("no-wait", 1.0) == "False False"
