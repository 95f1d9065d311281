"""What ``gpusnap run`` accepts, parsed into values, or refused with a ``UsageError``.

Everything here is checked before the run directory is touched, so a typo never leaves a
directory behind. Durations are seconds (float); signals are ``signal.Signals``.
"""

from __future__ import annotations

import keyword
import os
import re
import signal
import sys
from importlib.machinery import PathFinder

from gpusnap.errors import UsageError

DURATION_HINT = "write a duration as 90s, 10m, 1h, 1h30m, 500ms or plain seconds (45)"

_DURATION = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?(?:(?P<s>\d+(?:\.\d+)?)s)?"
    r"(?:(?P<ms>\d+(?:\.\d+)?)ms)?"
)


def parse_duration(text: str, option: str) -> float:
    """``90s``, ``10m``, ``1h``, ``1h30m``, ``500ms``, ``45`` (seconds) -> seconds, > 0."""
    value = text.strip().lower()
    seconds: float | None = None
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        seconds = float(value)
    elif value:
        m = _DURATION.fullmatch(value)
        if m and any(m.group(k) for k in ("h", "m", "s", "ms")):
            seconds = (
                float(m.group("h") or 0) * 3600
                + float(m.group("m") or 0) * 60
                + float(m.group("s") or 0)
                + float(m.group("ms") or 0) / 1000
            )
    if seconds is None:
        raise UsageError(f"malformed duration {text!r} for {option}", hint=DURATION_HINT)
    if seconds <= 0:
        raise UsageError(f"{option} must be longer than 0 s, not {text!r}", hint=DURATION_HINT)
    return seconds


OVERHEAD_HINT = "write the budget as a percentage of training time, e.g. --overhead 1% or --overhead 0.5"


def parse_every(text: str | None) -> tuple[float | None, bool]:
    """``--every``: (seconds, False) for a duration, (None, True) for ``auto``, (None, False)
    when not given."""
    if text is None:
        return None, False
    if text.strip().lower() == "auto":
        return None, True
    return parse_duration(text, "--every"), False


def parse_overhead(text: str | None, auto: bool, default: float) -> float | None:
    """``--overhead 1%`` (or ``1``: percent either way) -> 0.01; the budget of ``--every auto``,
    which it needs: without auto there is nothing for it to set."""
    if text is None:
        return default if auto else None
    if not auto:
        raise UsageError("--overhead is the budget of --every auto", hint="add --every auto, or drop --overhead")
    value = text.strip().removesuffix("%").strip()
    try:
        percent = float(value)
    except ValueError:
        raise UsageError(f"malformed budget {text!r} for --overhead", hint=OVERHEAD_HINT) from None
    if not 0 < percent <= 50:
        raise UsageError(f"--overhead must be more than 0% and at most 50%, not {text!r}", hint=OVERHEAD_HINT)
    return percent / 100


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)


# Signals a user may pick for --signal. The others either cannot be caught (KILL, STOP), already
# mean something to the supervisor (TERM, INT, HUP, CHLD), or are raised by faults and terminals.
# Schedulers use these: Slurm `--signal=B:USR1@60`, LSF USR2, SGE USR1/USR2, some XCPU.
SNAPSHOT_SIGNALS = tuple(
    s for s in ("SIGUSR1", "SIGUSR2", "SIGALRM", "SIGXCPU", "SIGPWR") if hasattr(signal, s)
)
SIGNAL_HINT = "use one of " + ", ".join(s[3:] for s in SNAPSHOT_SIGNALS) + " (SIG prefix and case optional)"


def parse_signal(text: str) -> signal.Signals:
    """``USR1`` / ``SIGUSR1`` / ``usr1`` -> ``signal.SIGUSR1``. Names only: numbers differ
    between platforms, and a name in a job script says what it means."""
    name = text.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    if name not in SNAPSHOT_SIGNALS:
        if name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGKILL", "SIGSTOP", "SIGCHLD"):
            raise UsageError(f"--signal cannot be {name[3:]}: it already means something", hint=SIGNAL_HINT)
        raise UsageError(f"unknown signal name {text!r} for --signal", hint=SIGNAL_HINT)
    return signal.Signals[name]


SIZE_HINT = "write a size as 512MB, 2GB, 100k or plain bytes (0 keeps no file content)"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?", re.IGNORECASE)


def parse_size(text: str, option: str) -> int:
    """``512MB``, ``2G``, ``1.5GiB``, ``100k``, ``4096`` -> bytes (MB is 10**6, MiB 2**20)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"malformed size {text!r} for {option}", hint=SIZE_HINT)
    number, unit, binary = m.groups()
    power = "kmgt".find(unit.lower()) + 1 if unit else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


def parse_keep(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--keep takes a number of snapshots >= 1, not {text!r}",
                         hint="e.g. --keep 3 keeps the three newest snapshots")
    return n


def is_module_name(name: str) -> bool:
    parts = name.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def resolve_script(script: str, cwd: str) -> str:
    """The script's absolute path; it must be a file."""
    path = os.path.normpath(os.path.join(cwd, script))
    if not os.path.exists(path):
        raise UsageError(f"no such script: {script}", hint="check the path; run a module with -m MODULE")
    if not os.path.isfile(path):
        raise UsageError(f"not a file: {script}", hint="pass the script file to run")
    return path


def check_module(module: str, cwd: str) -> str:
    """The module must be one that ``python -m`` in ``cwd`` would find: looked up on the path the
    trainee will have, without importing anything (the supervisor must not run the user's code,
    nor import torch)."""
    if not is_module_name(module):
        raise UsageError(f"not a module name: {module!r}", hint="pass a dotted name, e.g. -m mypkg.train")
    problem = _module_problem(module, [cwd, *sys.path[1:]])
    if problem is not None:
        raise UsageError(problem, hint="check the name, the working directory and PYTHONPATH; run a file with gpusnap run SCRIPT")
    return module


def _module_problem(name: str, search: list[str]) -> str | None:
    """Why ``python -m name`` would not find it, or None. Only what is certain is reported: a
    package whose submodules cannot be listed without running it is given the benefit of the
    doubt (the trainee then fails as python would)."""
    parts = name.split(".")
    spec = _find_top(parts[0], search)
    if spec is None:
        return f"no module named {name} ({parts[0]!r} is not in the working directory or on sys.path)"
    try:
        for depth, part in enumerate(parts[1:], 1):
            if spec.submodule_search_locations is None:
                return None  # not a package on disk (a module that makes its own submodules)
            parent = ".".join(parts[:depth])
            spec = PathFinder.find_spec(f"{parent}.{part}", list(spec.submodule_search_locations))
            if spec is None:
                return f"no module named {name} (package {parent!r} has no {part!r})"
        if spec.submodule_search_locations is not None and parts[-1] != "__main__":
            if PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations)) is None:
                return f"{name} is a package without a __main__ module: python -m cannot run it"
    except (ImportError, KeyError, ValueError, TypeError, AttributeError):
        return None  # a namespace package lists its parts only once imported
    return None


def _find_top(top: str, search: list[str]):
    spec = PathFinder.find_spec(top, search)
    if spec is not None:
        return spec
    # The other finders (built-in and frozen modules, editable installs) look a top-level name up
    # without importing anything.
    for finder in sys.meta_path:
        if finder is PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(top, None)
        except (ImportError, ValueError, TypeError, AttributeError):
            spec = None
        if spec is not None:
            return spec
    return None


def resolve_at(text: str | None, cwd: str) -> str | None:
    """``FILE:LINE`` -> ``/abs/FILE:LINE``; the file must exist and LINE must be a number >= 1."""
    if text is None:
        return None
    file, sep, line = text.rpartition(":")
    hint = "name the step loop as FILE:LINE, e.g. --at train.py:42"
    if not sep or not file or not line.isdigit() or int(line) < 1:
        raise UsageError(f"--at takes FILE:LINE, not {text!r}", hint=hint)
    path = os.path.normpath(os.path.join(cwd, file))
    if not os.path.isfile(path):
        raise UsageError(f"--at names a file that does not exist: {file}", hint=hint)
    return f"{path}:{int(line)}"


def resolve_instrument(items, cwd: str) -> list[str]:
    """Paths become absolute; anything else must be a dotted module name."""
    out = []
    for item in items:
        path = os.path.normpath(os.path.join(cwd, item))
        if os.path.exists(path):
            out.append(path)
        elif is_module_name(item):
            out.append(item)
        else:
            raise UsageError(f"--instrument {item}: no such file or directory, and not a module name",
                             hint="pass a source file, a directory of sources, or a dotted module name")
    return out
