"""Process-wide settings a program changes outside every object it holds (graph.settings)."""

from __future__ import annotations

import os

import pytest
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
        settings._start_environ = settings._threads_at_import = settings._start_cwd = None


def test_a_working_directory_the_program_entered_is_captured_and_entered_again_made_where_missing(tmp_path, monkeypatch):
    """An output directory named by the start time and entered in setup (chdir_outputs.py, as
    Hydra's `hydra.job.chdir` makes one): the replay's setup makes and enters another, and the
    metrics the program reads back by a relative path are in the run's. On another machine the
    run's directory may not be there yet: it is made."""
    monkeypatch.chdir(tmp_path)
    settings.note_start()
    try:
        assert "cwd" not in settings.capture()  # not changed: a restart keeps its own
        run_dir = tmp_path / "outputs" / "23-52-57"
        run_dir.mkdir(parents=True)
        os.chdir(run_dir)
        saved = settings.capture()
        assert saved["cwd"] == str(run_dir)

        replay_dir = tmp_path / "outputs" / "23-58-02"
        replay_dir.mkdir()
        os.chdir(replay_dir)
        assert settings.restore(saved) == [f"working directory {run_dir}"]
        assert os.getcwd() == str(run_dir)

        os.chdir(tmp_path)
        run_dir.rmdir()
        (tmp_path / "outputs").rename(tmp_path / "other")
        assert settings.restore(saved) == [f"working directory {run_dir}"]
        assert os.getcwd() == str(run_dir)
    finally:
        settings._start_environ = settings._threads_at_import = settings._start_cwd = None


def test_print_options_and_the_logging_level_disabled_are_captured_and_put_back():
    """`torch.set_printoptions(precision=3)`, `np.set_printoptions(precision=2, suppress=True)`,
    `logging.disable(logging.INFO)` once warm-up is over: from a later epoch, the replay printed
    and logged with the setup's, and the restart said "verified" with other lines in its log
    (late_knobs.py, 1 of 1 each)."""
    import logging

    import numpy as np

    numpy_options = np.get_printoptions()
    settings.note_start()
    try:
        assert settings.restore(settings.capture()) == []
        torch.set_printoptions(precision=3)
        np.set_printoptions(precision=2, suppress=True)
        logging.disable(logging.INFO)
        saved = settings.capture()

        torch.set_printoptions(profile="default")  # the replay's: the setup's
        np.set_printoptions(**numpy_options)
        logging.disable(logging.NOTSET)
        assert settings.restore(saved) == ["logging.disable(INFO)", "NumPy's print options", "torch's print options"]
        assert str(torch.tensor([1 / 3])) == "tensor([0.333])" and str(np.array([1 / 3, 1e-9])) == "[0.33 0.  ]"
        assert logging.root.manager.disable == logging.INFO
        assert settings.restore(saved) == []

        # the other way: the run had enabled again what the replay's setup disables
        logging.disable(logging.NOTSET)
        saved = settings.capture()
        logging.disable(logging.WARNING)
        assert settings.restore(saved) == ["logging.disable(NOTSET)"] and logging.root.manager.disable == logging.NOTSET
    finally:
        torch.set_printoptions(profile="default")
        np.set_printoptions(**numpy_options)
        logging.disable(logging.NOTSET)
        settings._start_environ = settings._threads_at_import = settings._start_cwd = None


def test_pandas_options_the_run_set_are_put_back_and_those_it_left_at_their_defaults_too():
    """`pd.set_option("display.precision", 3)` once warm-up is over, each epoch's DataFrame of
    metrics logged: from a later epoch the restart logged with the default precision, "verified"
    (warn_log.py --pandas, 2 of 2). What the replay's setup set that the run had put back to its
    default goes back too."""
    pd = pytest.importorskip("pandas")
    try:
        pd.set_option("display.precision", 3)
        saved = settings.capture()
        assert saved["pandas_options"] == {"display.precision": 3}

        pd.reset_option("display.precision")  # the replay's: the setup's
        pd.set_option("display.max_rows", 7)
        assert settings.restore(saved) == ["pandas' display.max_rows", "pandas' display.precision"]
        assert pd.get_option("display.precision") == 3 and pd.get_option("display.max_rows") == 60
        assert settings.restore(saved) == []
    finally:
        pd.reset_option("display.precision")
        pd.reset_option("display.max_rows")
