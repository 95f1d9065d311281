"""The restart drills of the GPU check (tools/gpu_check.sh): each program is run uninterrupted,
then under `gpusnap run`, snapshotted at a random step, killed -9 and restarted, and its final
bytes are compared with the uninterrupted run's; one verdict line per drill.

    python tools/gpu_drills.py [--dry-run] [--only cnn,gpt,...] [--seed N] [--jobs N]

Drills (programs under tests/programs):

- cnn          cuda/cnn.py: a CNN with AdamW, BatchNorm and a shuffled DataLoader,
               deterministic algorithms;
- gpt          cuda/gpt.py: a small GPT-style model in bf16 autocast with gradient accumulation;
- cuda-python  notorch/rawcuda.py: cuMemAlloc, cuMemAllocManaged and VMM memory, work left
               queued at every step, a CUdeviceptr translated on restore;
- cupy         cuda/cupy_sgd.py: SGD in CuPy arrays;
- cpu-restore  on_cuda.py: a GPU snapshot restored onto the CPU (the restart sees no GPU).

Drills run side by side (--jobs, default all of them): they check bytes, not time. --dry-run
(no GPU): the cuda-python drill runs for real on the fake GPU, which exercises all of the
driver logic here; the torch programs are compiled and imported; the others are compiled. Exit status 1 when a drill did not end identical.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import py_compile
import random
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness import (  # noqa: E402
    Run,
    assert_same,
    copy_programs,
    gpusnap,
    kill_and_restart,
    load_final,
    plain,
    progress,
    ref_and_out,
    request_snapshot,
    wait_for,
)

ENV = {"OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
PACED = {**ENV, "TEST_STEP_SLEEP_S": "0.05"}
# name: (program under tests/programs, steps, what it saves: "torch" final.pt or "json" final.json)
DRILLS = {
    "cnn": ("cuda/cnn.py", 40, "torch"),
    "gpt": ("cuda/gpt.py", 40, "torch"),
    "cuda-python": ("notorch/rawcuda.py", 60, "json"),
    "cupy": ("cuda/cupy_sgd.py", 200, "json"),
    "cpu-restore": ("on_cuda.py", 300, "torch"),
}


def final(out: pathlib.Path, saves: str):
    return load_final(out) if saves == "torch" else json.loads((out / "final.json").read_text())


def drill(name: str, work: pathlib.Path, seed: int, device: str) -> str:
    """Run one drill in ``work``; its verdict line."""
    program, steps, saves = DRILLS[name]
    script = copy_programs(work) / program
    ref, out = ref_and_out(work)
    env = {**ENV, "GPUSNAP_DEVICE": device}
    if saves == "json":  # raw cuda-python may run on the fake GPU, which only gpusnap installs
        done = gpusnap("run", "--dir", "refsnaps", script, ref, steps, cwd=work, env=env)
        assert done.returncode == 0, done.stderr
    else:
        plain(script, ref, steps, cwd=work, env=env)
    if name == "cpu-restore":
        run = Run("run", "--dir", "snaps", script, out, steps, cwd=work, env={**PACED, "GPUSNAP_DEVICE": device})
        snap_at = random.Random(seed).randint(20, steps // 2)
        wait_for(lambda: progress(out) >= snap_at, f"step {snap_at}", proc=run)
        snap_id = request_snapshot(run, work / "snaps")
        run.kill_group()
        restarted = gpusnap("restart", "snaps", cwd=work, env={**env, "CUDA_VISIBLE_DEVICES": ""})
        assert restarted.returncode == 0, restarted.stderr
        where = f"snapshot {snap_id} at step {snap_at}, restored with no GPU visible"
    else:
        restarted = kill_and_restart(script, [steps], work, out, random.Random(seed), steps, env, {**PACED, "GPUSNAP_DEVICE": device})
        where = next((line.split("gpusnap: ", 1)[1] for line in restarted.stderr.splitlines() if "restored snapshot" in line),
                     "restored")
    expected, got = final(ref, saves), final(out, saves)
    if saves == "torch":
        assert_same(expected, got)
    else:
        assert expected == got, "final.json differs"
    return f"identical ({where})"


def dry(name: str, work: pathlib.Path) -> str:
    """Without a GPU: compile the program, and import the torch ones (their setup runs on the CPU
    as far as a module import goes; a main guard keeps the training out)."""
    program, _, saves = DRILLS[name]
    script = copy_programs(work) / program
    py_compile.compile(str(script), doraise=True)
    if saves != "torch" or name == "cpu-restore":  # CuPy is not here; on_cuda.py trains at import
        return "compiled (needs a GPU)"
    code = f"import sys; sys.argv[1:] = [{str(work)!r}, '2']; sys.path.insert(0, {str(script.parent)!r}); import {script.stem}"
    done = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=240,
                          env={**os.environ, **ENV})
    assert done.returncode == 0, done.stderr
    return "compiled and imported (needs a GPU)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: the cuda-python drill on the fake GPU, the rest compiled")
    parser.add_argument("--only", default=",".join(DRILLS), help="drills to run, comma-separated")
    parser.add_argument("--seed", type=int, default=None, help="the random snapshot moments (default: a fresh one, printed)")
    parser.add_argument("--jobs", type=int, default=len(DRILLS))
    args = parser.parse_args()
    names = [name for name in args.only.split(",") if name]
    unknown = set(names) - set(DRILLS)
    if unknown:
        parser.error(f"unknown drills: {', '.join(sorted(unknown))} (known: {', '.join(DRILLS)})")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"drills: {', '.join(names)}; seed {seed} (--seed {seed} repeats the snapshot moments)", flush=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gpusnap-drills-"))

    def one(name: str) -> tuple[str, bool]:
        started = time.perf_counter()
        work = scratch / name
        work.mkdir()
        try:
            if not args.dry_run:
                verdict = drill(name, work, seed, "cuda")
            elif name == "cuda-python":
                verdict = drill(name, work, seed, "fake") + " on the fake GPU"
            else:
                verdict = dry(name, work)
            ok = True
        except AssertionError as exc:
            verdict, ok = f"DIFFERS or FAILED: {str(exc).strip()[-2000:]}", False
        except Exception as exc:  # noqa: BLE001 - one drill's failure is its verdict; the others still run
            verdict, ok = f"FAILED: {type(exc).__name__}: {str(exc).strip()[-2000:]}", False
        return f"drill {name}: {verdict} [{time.perf_counter() - started:.1f} s]", ok

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, names))
    for line, _ in results:
        print(line, flush=True)
    if all(ok for _, ok in results):
        shutil.rmtree(scratch, ignore_errors=True)
        return 0
    print(f"the failed drills' runs are kept in {scratch}")
    return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
