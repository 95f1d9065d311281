"""A loop gpusnap does not instrument runs the optimizer steps (a trainer library outside the
script's directory): the first step says so once, naming the loop and the option; with that
option the snapshot lands inside the library's loop and the restart ends with the same bytes."""

from __future__ import annotations

import signal

import pytest

from harness import Run, assert_same, committed_ids, gpusnap, load_final, plain, programs_and_out, progress, snapshot_now, wait_for

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

LIBRARY = '''\
"""A trainer in the style of the frameworks: the step loop lives here, not in the script."""
import torch


def fit(model, optimizer, data, steps, on_step):
    for step in range(steps):
        x, y = data[step % len(data)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        on_step(step + 1)
'''

SCRIPT = '''\
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vendor"))
import torch
from minitrainer import fit

OUT = sys.argv[1]


def progress(step):
    with open(os.path.join(OUT, "progress.tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(OUT, "progress.tmp"), os.path.join(OUT, "progress"))
    import time
    time.sleep(float(os.environ.get("TEST_STEP_SLEEP_S", "0.01")))


torch.manual_seed(4)
model = torch.nn.Linear(5, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = [(torch.randn(8, 5), torch.randn(8, 2)) for _ in range(7)]
fit(model, optimizer, data, int(sys.argv[2]), progress)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(OUT, "final.pt"))
'''


def _layout(tmp_path):
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "minitrainer.py").write_text(LIBRARY)
    (tmp_path / "app").mkdir()
    script = tmp_path / "app" / "train.py"
    script.write_text(SCRIPT)
    for name in ("ref", "out"):
        (tmp_path / name).mkdir()
    return script


def test_an_uninstrumented_step_loop_is_named_once_at_the_first_step(tmp_path):
    script = _layout(tmp_path)
    run = Run("run", "--dir", "snaps", "--grace", "2s", script, tmp_path / "out", 400, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.02"})
    wait_for(lambda: progress(tmp_path / "out") >= 3, "step 3", proc=run)
    run.signal(signal.SIGTERM)
    code, _, err = run.wait()
    line = LIBRARY.splitlines().index("        optimizer.step()") + 1
    notice = f"gpusnap: the optimizer steps inside a loop at {tmp_path / 'vendor' / 'minitrainer.py'}:{line} (fit), which gpusnap does not instrument"
    assert err.count(notice) == 1, err
    assert "(--instrument minitrainer instruments the way there)" in err
    # The only boundaries are the script's top level, reached after fit() returns: the snapshot
    # waits, and SIGTERM's grace ends the run without one.
    assert code == 76, err


def test_with_the_library_instrumented_the_snapshot_lands_inside_its_loop(tmp_path):
    script = _layout(tmp_path)
    plain(script, tmp_path / "ref", 40, cwd=tmp_path)
    run = Run("run", "--dir", "snaps", "--instrument", "minitrainer", script, tmp_path / "out", 40, cwd=tmp_path, env={"TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(tmp_path / "out") >= 6, "step 6", proc=run)
    snap = snapshot_now(run, tmp_path / "snaps", tmp_path)
    wait_for(lambda: progress(tmp_path / "out") >= snap["iteration"] + 3, "three more steps", proc=run)
    run.kill_group()
    assert "does not instrument" not in run.proc.stderr.read()

    restarted = gpusnap("restart", "snaps", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    assert_same(load_final(tmp_path / "ref"), load_final(tmp_path / "out"))


def test_a_step_loop_in_a_coroutine_is_named_and_never_snapshotted(tmp_path):
    """async_learner.py steps the optimizer in an `async def` that asyncio's event loop drives.
    The first step said to instrument asyncio's modules; with them instrumented, a snapshot
    landed in the event loop's own loop, and its restart was refused ("the program took an
    optimizer step before reaching the saved position"): replay cannot bring suspended
    coroutines back. Now the first step says so, and no boundary is a safe point while an event
    loop runs, even with asyncio instrumented: the request is never served."""
    asyncio_modules = [arg for module in ("asyncio.runners", "asyncio.base_events", "asyncio.events") for arg in ("--instrument", module)]
    programs, out = programs_and_out(tmp_path)
    run = Run("run", "--dir", "snaps", *asyncio_modules, programs / "async_learner.py", out, 60, cwd=tmp_path,
              env={"TEST_STEP_SLEEP_S": "0.05"})
    wait_for(lambda: progress(out) >= 3, "step 3", proc=run)
    run.signal(signal.SIGUSR1)
    code, _, err = run.wait()
    assert code == 0 and progress(out) == 60, err
    notice = f"gpusnap: the optimizer steps inside a coroutine at {programs / 'async_learner.py'}:"
    assert err.count(notice) == 1 and "(learn), which an event loop drives: no snapshot can be taken there" in err, err
    assert "--instrument" not in err
    assert not committed_ids(tmp_path / "snaps"), err
