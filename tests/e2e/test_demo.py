"""`gpusnap demo` ships inside the package and does what the README's first command promises:
a run snapshotted, killed -9 and restarted, identical to the uninterrupted run."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile

import pytest

from harness import REPO, gpusnap

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop


def test_the_demo_restarts_a_killed_run_to_the_same_bytes(tmp_path):
    done = gpusnap("demo", "--epochs", "2", "--dir", str(tmp_path / "work"), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"snapshot 000001 at step \d+: training stalled [\d.]+ ms, [\d.]+ MB written for [\d.]+ MB of state", out), out
    assert re.search(r"restored [\d.]+ s after the command started \(replay [\d.]+ s, fast-forward [\d.]+ s, merge [\d.]+ s\)", out), out
    assert re.search(r"the restart checked itself against what followed the snapshot: (verified: the \d iterations? after it "
                     r"match the run that took it|unverified: the snapshot has no witness)", out), out
    assert "identical: all 8 tensors" in out


def test_the_wheel_carries_the_demo(tmp_path):
    """After a plain `pip install` there is no repository: the demo's program is package data."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("gpusnap-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpusnap/demo/train.py" in names and "gpusnap/demo/__init__.py" in names and "gpusnap/cli/demo.py" in names
