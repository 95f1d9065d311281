"""The warnings a program was shown once per place stay shown: across the snapshot's fork, and
across a restart into a fresh interpreter (graph.warned)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

from gpusnap.graph import warned


def _warn_here():
    warnings.warn("shown once per place", UserWarning)


def _shown(call) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        call()
    return len(caught)


def test_reading_the_filters_version_and_forking_leave_what_was_shown_alone():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        _warn_here()
        version = warned.filters_version()
        assert isinstance(version, int)
        with warned.ignored(DeprecationWarning, ".*fork.*"):  # the snapshot's fork's
            assert warned.filters_version() == version
        assert warned.filters_version() == version, "the fork's filter bumped the version"
        _warn_here()
        assert len(caught) == 1, "shown again"
        warnings.filterwarnings("ignore", message="nothing of this test's")
        _warn_here()  # a bump, as filterwarnings makes: shown again, as Python does
        assert len(caught) == 2
        assert warned.filters_version() != version


# A program in a fresh interpreter: shown once, captured; then another interpreter puts the
# capture back (as a restart does) and warns at the same places.
_PROGRAM = r"""
import json, sys, warnings
from gpusnap.graph import warned

def here(): warnings.warn("from the program's line", FutureWarning)
def once(): warnings.warn("once for the process", UserWarning)

warnings.filterwarnings("once", message="once for the process")
shown = []
warnings.showwarning = lambda message, *rest: shown.append(str(message))
if sys.argv[1] == "run":
    here(); here(); once(); once()
    print(json.dumps({"shown": shown, "warned": warned.capture()}))
else:
    warned.restore(json.loads(sys.stdin.read())["warned"])
    here(); once()
    warnings.warn("new after the restart", UserWarning)
    print(json.dumps({"shown": shown}))
"""


def test_a_restarted_interpreter_does_not_show_again_what_the_run_had_shown(tmp_path):
    run = subprocess.run([sys.executable, "-c", _PROGRAM, "run"], capture_output=True, text=True, check=True)
    captured = json.loads(run.stdout)
    assert captured["shown"] == ["from the program's line", "once for the process"]
    assert captured["warned"]["modules"]["__main__"], captured["warned"]
    restarted = subprocess.run([sys.executable, "-c", _PROGRAM, "restart"], input=run.stdout, capture_output=True, text=True,
                               check=True)
    assert json.loads(restarted.stdout)["shown"] == ["new after the restart"]
