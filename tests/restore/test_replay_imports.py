"""A module of the program's that the run first imported inside its loop, in a step the replay
skips (tests/programs/corpus/late_import.py, refused 3 of 3 before: "module report_utils held
state in the snapshot but is not imported at the resume point"): the restore imports it before
the merge, and says why where it cannot."""

from __future__ import annotations

import sys

import pytest

from gpusnap.errors import ReplayDiverged
from gpusnap.restore.replay import _import_what_the_run_imported_later


def test_a_module_the_run_imported_in_a_skipped_step_is_imported_before_the_merge(tmp_path, monkeypatch):
    (tmp_path / "report_helpers_late.py").write_text("HISTORY = []\nimported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "report_helpers_late", raising=False)
    _import_what_the_run_imported_later({"report_helpers_late": {"HISTORY": [1]}})
    assert sys.modules["report_helpers_late"].imported
    sys.modules.pop("report_helpers_late")


def test_a_module_the_replay_cannot_import_is_refused_naming_why(tmp_path, monkeypatch):
    (tmp_path / "broken_helpers_late.py").write_text("raise RuntimeError('needs the run directory')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ReplayDiverged, match="module gone_helpers held state in the snapshot but is not imported at the resume "
                                             "point, and importing it failed: ModuleNotFoundError"):
        _import_what_the_run_imported_later({"gone_helpers": {}})
    with pytest.raises(ReplayDiverged, match="importing it failed: RuntimeError: needs the run directory"):
        _import_what_the_run_imported_later({"broken_helpers_late": {}})
