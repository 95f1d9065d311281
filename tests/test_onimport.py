"""``gpusnap.onimport.after_import``: code that runs right after a module's own code, the first
time the program imports it, without importing it first; at once when it is imported already."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

from gpusnap import onimport


@pytest.fixture(autouse=True)
def _nothing_else_waits(monkeypatch):
    """Each test starts with no callback waiting: other tests in the same process (gpusnap's
    savers, imported with its framework adapters) leave theirs waiting for modules never imported."""
    monkeypatch.setattr(onimport, "_waiting", {})
    monkeypatch.setattr(sys, "meta_path", [finder for finder in sys.meta_path if finder is not onimport._FINDER])


def _module(tmp_path, monkeypatch, name: str, body: str = "VALUE = 41\n") -> None:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


def test_callbacks_run_after_the_module_code_in_order_once(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "onimport_probe_a")
    seen = []
    onimport.after_import("onimport_probe_a", lambda m: seen.append(("first", m.VALUE)))
    onimport.after_import("onimport_probe_a", lambda m: seen.append(("second", m.VALUE)))
    assert seen == [] and "onimport_probe_a" not in sys.modules  # nothing imported ahead
    import onimport_probe_a

    assert seen == [("first", 41), ("second", 41)]
    assert onimport._FINDER not in sys.meta_path  # nothing waits: every import pays nothing more
    # The module keeps its own loader: its source is there for inspect (and torch's tracing).
    assert "VALUE = 41" in inspect.getsource(onimport_probe_a)


def test_a_module_imported_already_gets_its_callback_at_once(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "onimport_probe_b")
    import onimport_probe_b

    seen = []
    onimport.after_import("onimport_probe_b", lambda m: seen.append(m))
    assert seen == [onimport_probe_b]
    assert onimport._FINDER not in sys.meta_path


def test_a_module_not_found_keeps_its_callbacks_waiting(tmp_path, monkeypatch):
    seen = []
    onimport.after_import("onimport_probe_c", lambda m: seen.append(m.VALUE))
    try:
        try:
            import onimport_probe_c  # noqa: F401 - not there yet
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("imported a module that does not exist")
        assert seen == [] and onimport._FINDER in sys.meta_path
        _module(tmp_path, monkeypatch, "onimport_probe_c", "VALUE = 7\n")
        import onimport_probe_c  # noqa: F401, F811 - there now

        assert seen == [7]
    finally:
        onimport._waiting.pop("onimport_probe_c", None)
        if not onimport._waiting and onimport._FINDER in sys.meta_path:
            sys.meta_path.remove(onimport._FINDER)


def test_a_submodule_is_found_behind_the_finder(tmp_path, monkeypatch):
    package = tmp_path / "onimport_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inner.py").write_text("NAME = __name__\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    seen = []
    onimport.after_import("onimport_probe_pkg.inner", lambda m: seen.append(m.NAME))
    import onimport_probe_pkg.inner  # noqa: F401

    assert seen == ["onimport_probe_pkg.inner"]
