"""tools/gpu_check.sh, the GPU check, in its dry run: on a machine without a GPU every step it can
runs against the fake GPU, so the script is known to work before a GPU machine's 15 minutes are
spent on it. Between them the two tests run every step once: the quick one the cheap steps, the
slow one the gpu tests (collected) and the drills (the cuda-python one killed and restarted on
the fake GPU)."""

from __future__ import annotations

import re
import subprocess

import pytest
from harness import REPO, _env

pytestmark = pytest.mark.slow  # end-to-end runs: the full suite, not the quick loop

PROBES = ["dontfork", "orphaned-pages", "stream-race", "address-range", "managed-ordinal", "allocator", "first-alloc",
          "fingerprint"]


def dry_run(out, only: str | None = None) -> str:
    command = ["bash", str(REPO / "tools" / "gpu_check.sh"), "--dry-run", str(out)] + (["--only", only] if only else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return (out / "summary.txt").read_text()


def check_plan(summary: str) -> None:
    plan = dict(re.findall(r"^  (\w+) +(\d+) s  ", summary, re.M))
    assert list(plan) == ["install", "env", "probes", "tests", "drills", "fingerprint", "bench"]
    budgets = {name: int(secs) for name, secs in plan.items()}
    # tests and drills run side by side: the run's length is the rest plus the longer of the two
    longest = sum(budgets.values()) - min(budgets["tests"], budgets["drills"])
    assert f"so the run takes at most {longest} s" in summary
    assert longest <= 7 * 60, "the check must end within 7 minutes of the machine's 15"


@pytest.mark.more  # the dry run's tests and drills below run the script too (CI's time)
def test_the_cheap_steps_of_the_dry_run_work_on_the_fake_gpu(tmp_path):
    summary = dry_run(tmp_path, "install,env,probes,fingerprint,bench")
    check_plan(summary)
    for name in ("install", "env", "probes", "fingerprint", "bench"):
        assert re.search(rf"^step {name}: ok \[\d+ s\]", summary, re.M), summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.txt", "env.txt", "fingerprint.txt", "probes.txt", "summary.txt"]
    verdicts = dict(re.findall(r"^probe ([\w-]+): (.*)$", summary, re.M))
    assert list(verdicts) == PROBES, summary
    assert verdicts["orphaned-pages"].startswith("orphaned: ")  # what the fake models, the arena avoids
    assert verdicts["stream-race"].startswith("a non-blocking stream overtook a memset 20/20 times")
    assert verdicts["address-range"].startswith("rounded up to 10,240 bytes")
    assert "cuda.core pool preferring the host -1" in verdicts["managed-ordinal"]
    assert verdicts["fingerprint"].startswith("the kernel agrees with its definition")
    assert "agrees with the NumPy reference: yes" in summary
    assert "## 8 GB of model + Adam state" in summary  # the preflight ran for both sizes


@pytest.mark.slow
def test_the_tests_and_drills_of_the_dry_run_work_on_the_fake_gpu(tmp_path):
    summary = dry_run(tmp_path, "tests,drills")
    check_plan(summary)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drills.txt", "summary.txt", "tests.txt"]
    assert re.search(r"^step tests: ok ", summary, re.M) and re.search(r"^step drills: ok ", summary, re.M), summary
    assert re.search(r"^drill cuda-python: identical \(.*\) on the fake GPU", summary, re.M), summary
    assert re.search(r"^drill cnn: compiled and imported", summary, re.M)
    collected = (tmp_path / "tests.txt").read_text()
    assert re.search(r"^\d+(/\d+)? tests? collected", collected, re.M), collected
