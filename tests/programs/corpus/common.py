"""The corpus programs share tests/programs/common.py, one folder up. A script's own folder is
the one on sys.path (as with `python word_lm.py`), so this module loads that file and re-exports
its helpers: `from common import finish, progress` reads the same in every program."""
import importlib.util
import os
import sys

_PROGRAMS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(_PROGRAMS)  # what common.py imports in turn (notorch.pace), after the script's own folder
_spec = importlib.util.spec_from_file_location("programs_common", os.path.join(_PROGRAMS, "common.py"))
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
del _spec

OUT = _common.OUT
progress = _common.progress
finish = _common.finish
