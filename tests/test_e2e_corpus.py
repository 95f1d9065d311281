"""Programs written the way people write them (tests/programs/corpus: the PyTorch examples' word
language model, DCGAN, MNIST and LBFGS time series; tqdm loops; a script's usual furniture; a
torch.compile'd model) continue with the same bytes after a kill: each is run uninterrupted, and
again under `gpusnap run` with SIGUSR1 at a random step, kill -9 of the whole process group a few
steps later, then `gpusnap restart`. One seed per program by default (printed; pytest shows it on
failure); GPUSNAP_TEST_SEEDS=1,2,3 runs more."""

from __future__ import annotations

import os
import random
import time

import pytest
from harness import assert_same, copy_programs, kill_and_restart, load_final, plain, progress

SEEDS = [int(s) for s in os.environ.get("GPUSNAP_TEST_SEEDS", "1").split(",")]

# name: (program under programs/corpus, arguments after OUT)
CORPUS = {
    "word_lm": ("word_lm.py", []),
    "dcgan": ("dcgan.py", []),
    "mnist_cnn": ("mnist_cnn.py", []),
    "lbfgs_series": ("lbfgs_series.py", []),
    "tqdm_loop-for": ("tqdm_loop.py", ["--variant", "for"]),
    "tqdm_loop-pbar": ("tqdm_loop.py", ["--variant", "pbar"]),
    "furniture": ("furniture.py", []),
    "compiled": ("compiled.py", []),  # torch.compile builds C++ kernels: ~5 s warm, ~20 s cold, per run
}
# These models are small: with the cores shared by the writer (and other tests), intra-op threads
# spend more time waiting for each other than computing. Every run of a test gets the same setting.
ENV = {"OMP_NUM_THREADS": "1"}
SLOW = {**ENV, "TEST_STEP_SLEEP_S": "0.04"}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", CORPUS)
def test_corpus_program_restarts_to_the_same_bytes(tmp_path, name, seed):
    if name.startswith("tqdm_loop"):
        pytest.importorskip("tqdm")
    started = time.monotonic()
    program, args = CORPUS[name]
    rnd = random.Random(f"{name}/{seed}")
    print(f"program {name} seed {seed}")
    script = copy_programs(tmp_path) / "corpus" / program
    ref, out = tmp_path / "ref", tmp_path / "out"
    ref.mkdir()
    out.mkdir()
    plain(script, ref, *args, cwd=tmp_path, env=ENV)
    total = progress(ref)
    print(f"reference: {total} steps in {time.monotonic() - started:.1f} s")

    kill_and_restart(script, args, tmp_path, out, rnd, total, ENV, SLOW)
    assert_same(load_final(ref), load_final(out))
    print(f"{name}: {time.monotonic() - started:.1f} s")
