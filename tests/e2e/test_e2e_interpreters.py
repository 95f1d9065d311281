"""A killed run continues with the same bytes under every supported interpreter: each writes frame
locals its own way (gpusnap/restore/frames.py) and boots its own way. The programs of
tests/programs/notorch need no torch, so they run under the environments that
tools/interpreters.sh makes (.venv-py312, .venv-py313; an interpreter without one is skipped),
and, with GPUSNAP_TEST_CORPUS=all, under this interpreter too. Each program runs uninterrupted, then under `gpusnap run` with SIGUSR1 at a
random step and kill -9 of the whole group a few steps later, then `gpusnap restart`; final.json
must be the same bytes. Seeds are printed; GPUSNAP_TEST_SEEDS=1,2,3 runs more."""

from __future__ import annotations

import os
import random
import sys

import pytest
from harness import REPO, Run, copy_programs, gpusnap, interrupt, plain, progress, ref_and_out

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

# The suite's own interpreter restarts hundreds of programs elsewhere (these steps' frames, closures
# and cycles among them: the corpus's closures.py, test_e2e_graphs.py): for CI's time, it runs
# these only with GPUSNAP_TEST_CORPUS=all.
VERSIONS = tuple(v for v in ("3.11", "3.12", "3.13")
                 if os.environ.get("GPUSNAP_TEST_CORPUS") == "all" or v != "%d.%d" % sys.version_info[:2])
SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]
# These steps take no time of their own: paced slower, the run leaves the harness's `gpusnap ls`
# polls (a new interpreter each) time to see the snapshot before the program ends.
SLOW = {"TEST_STEP_SLEEP_S": "0.05"}

# name: (program in notorch/, arguments after OUT, steps the run reports in total)
PROGRAMS = {
    "counters-main-locals-globals": ("counters.py", [80], 80),
    "closure-nonlocal-cells": ("closure.py", [80], 80),
    "factory-closure-local-class": ("factory.py", [80], 80),
    "nested-frames-epoch-step": ("nested.py", [4, 20], 80),
    "cycles-argparse-parents-self-list": ("cycles.py", ["--steps", 80], 80),
    "rng-numpy-generator-sgd": ("rng_sgd.py", [4, 20], 80),
    "do-not-fork-memory-staged-by-the-trainee": ("dontfork.py", [80], 80),
    # the program's files put back: each interpreter's audit events (it exits 3 on a difference)
    "files-every-kind-of-write": ("files_ops.py", [40], 40),
}


@pytest.fixture(params=VERSIONS)
def python(request) -> str:
    """This interpreter for its own version, else the environment tools/interpreters.sh made."""
    version = request.param
    if version == "%d.%d" % sys.version_info[:2]:
        return sys.executable
    venv = REPO / f".venv-py{version.replace('.', '')}"
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no Python {version} environment: bash tools/interpreters.sh makes {venv.name}")
    return str(venv / "bin" / "python")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", PROGRAMS)
def test_killed_run_restarts_to_the_same_bytes(tmp_path, python, name, seed):
    program, args, total = PROGRAMS[name]
    rnd = random.Random(f"{name}/{seed}")
    print(f"program {name} seed {seed} python {python}")
    program = copy_programs(tmp_path) / "notorch" / program
    ref, out = ref_and_out(tmp_path)
    plain(program, ref, *args, cwd=tmp_path, python=python)

    run = Run("run", "--dir", "snaps", program, out, *args, cwd=tmp_path, env=SLOW, python=python)
    snap = interrupt(run, out, tmp_path / "snaps", tmp_path, rnd, total)
    print(f"snapshot {snap['id']} at iteration {snap['iteration']}, killed at step {progress(out)}")

    restarted = gpusnap("restart", "snaps", cwd=tmp_path, python=python)
    assert restarted.returncode == 0, restarted.stderr
    assert f"restored snapshot {snap['id']}" in restarted.stderr
    print(*[line for line in restarted.stderr.splitlines() if "fast-forward" in line or "restored snapshot" in line], sep="\n")
    # json.dump writes ASCII: equal text is equal bytes, and pytest shows a diff of text.
    assert (out / "final.json").read_bytes().decode() == (ref / "final.json").read_bytes().decode()
