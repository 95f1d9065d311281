"""Boot installs the raw-allocation registry before the program's imports, at no cost to a
program that never imports cuda-python, and GPUSNAP_DEVICE=fake puts the fake GPU under it."""

from __future__ import annotations

import json
import subprocess
import sys

from harness import _env

PROBE = """
import json, sys
before = sorted(m for m in sys.modules if m.startswith("cuda"))
report = {"before": before}
if len(sys.argv) > 1:
    from cuda.bindings import driver
    report["fake"] = driver.__name__.startswith("gpusnap.")
    report["wrapped"] = hasattr(driver.cuMemAlloc, "__gpusnap_original__")
    assert int(driver.cuInit(0)[0]) == 0
    dev = driver.cuDeviceGet(0)[1]
    driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(dev)[1])
    err, ptr = driver.cuMemAlloc(4096)
    report["alloc"] = int(err)
    from gpusnap.device import tracking
    report["tracked"] = [(e.api, e.nbytes, e.call_site.rsplit(":", 1)[1]) for e in tracking.registry().live()]
print(json.dumps(report))
"""


def boot(tmp_path, *args, env=None):
    (tmp_path / "probe.py").write_text(PROBE)
    result = subprocess.run([sys.executable, "-m", "gpusnap.boot", str(tmp_path / "probe.py"), *args], cwd=tmp_path,
                            capture_output=True, text=True, env=_env(env), timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_boot_imports_no_cuda_bindings_for_a_program_that_does_not(tmp_path):
    assert boot(tmp_path)["before"] == []


def test_a_program_on_the_fake_gpu_allocates_through_tracked_functions(tmp_path):
    report = boot(tmp_path, "alloc", env={"GPUSNAP_DEVICE": "fake"})
    assert report["fake"] and report["wrapped"] and report["alloc"] == 0
    line = next(i for i, text in enumerate(PROBE.splitlines(), 1) if "cuMemAlloc(4096)" in text)
    assert report["tracked"] == [["cuMemAlloc", 4096, str(line)]]


def test_the_real_bindings_are_wrapped_when_the_program_imports_them(tmp_path):
    (tmp_path / "real.py").write_text(
        "from cuda.bindings import driver, runtime\n"
        "print(hasattr(driver.cuMemAlloc, '__gpusnap_original__'), hasattr(runtime.cudaMalloc, '__gpusnap_original__'),"
        " driver.__name__)\n")
    result = subprocess.run([sys.executable, "-m", "gpusnap.boot", "real.py"], cwd=tmp_path, capture_output=True,
                            text=True, env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "cuda.bindings.driver"]
