"""Process-wide settings a program changes outside every object it holds (graph.settings)."""

from __future__ import annotations

import os

import torch

from gpusnap.graph import settings


def test_what_the_program_changed_process_wide_is_captured_and_put_back_and_nothing_else(monkeypatch):
    """A restart's replay skips the step that set them: `os.environ["NOISE_SCALE"] = "0.05"`,
    `torch.set_default_dtype(torch.float64)`, `torch.set_num_threads(2 * n)` at a phase change
    (global_modes.py: the threads one restarted "verified" with other final state, 2 of 3). The
    snapshot keeps what the program changed, and only that: a variable it did not touch keeps
    the restarting process's value (the scheduler's, another machine's)."""
    monkeypatch.setenv("GPUSNAP_TEST_UNTOUCHED", "run")
    monkeypatch.setenv("GPUSNAP_TEST_REMOVED", "there")
    monkeypatch.delenv("GPUSNAP_TEST_SET", raising=False)
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    settings.note_start()  # (torch is imported: what it chose is taken at once, what it has now)
    try:
        assert settings.restore(settings.capture()) == []  # nothing changed: nothing to put back
        os.environ["GPUSNAP_TEST_SET"] = "0.05"
        del os.environ["GPUSNAP_TEST_REMOVED"]
        torch.set_num_threads(threads + 1)
        torch.set_default_dtype(torch.float64)
        saved = settings.capture()
        assert saved["environ"] == {"set": {"GPUSNAP_TEST_SET": "0.05"}, "unset": ["GPUSNAP_TEST_REMOVED"]}

        # the restart: its own environment, the setup's settings
        os.environ["GPUSNAP_TEST_UNTOUCHED"] = "restart"
        os.environ["GPUSNAP_TEST_REMOVED"] = "there"
        del os.environ["GPUSNAP_TEST_SET"]
        torch.set_num_threads(threads)
        torch.set_default_dtype(torch.float32)
        put = settings.restore(saved)
        assert put == ["$GPUSNAP_TEST_SET", "$GPUSNAP_TEST_REMOVED (unset)", f"{threads + 1} intra-op threads",
                       "default dtype float64"]
        assert os.environ["GPUSNAP_TEST_SET"] == "0.05" and "GPUSNAP_TEST_REMOVED" not in os.environ
        assert os.environ["GPUSNAP_TEST_UNTOUCHED"] == "restart"
        assert torch.get_num_threads() == threads + 1 and torch.get_default_dtype() == torch.float64
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        settings._start_environ = settings._threads_at_import = None
