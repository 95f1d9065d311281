"""Process-wide settings the program changed, which no object it holds carries: its environment
variables, its working directory, torch's intra-op threads, default dtype, float32 matmul
precision and deterministic mode, how torch and NumPy print arrays, pandas' options, and the level
`logging.disable` silences. Read at the safe point (``capture``), put back after the merge
(``restore``).

The replay runs the setup again, and with it the changes the setup made; a change made in a step
the replay skips (`os.environ["NOISE_SCALE"] = "0.05"` or `torch.set_default_dtype(torch.float64)`
at a phase change) was lost, and the restart went on with the setup's. Where the intra-op threads
differ, the witness cannot compare the parameters at all (other threads, other last bits).

Of the environment, only what the program changed is kept: the variables it set, changed or
removed since its start (``note_start``); a restart keeps its own environment for the rest (the
scheduler's, the launcher's, another machine's). The working directory likewise, where the
program changed it: an output directory named by the start time and entered in setup, as
Hydra's `hydra.job.chdir` makes, is another one in the replay, and the files the program writes
and reads back by relative paths are in the run's. The threads likewise, where the program set
them away from what torch chose at its import. The torch settings are read and set only where
the program has imported torch.

The print options and the logging level shape the lines a log gets: `torch.set_printoptions(precision=3)`,
`np.set_printoptions(precision=2, suppress=True)` or `logging.disable(logging.INFO)` once warm-up is
over, from a later epoch, restarted "verified" with the setup's, the log's later lines other bytes
(``tests/programs/corpus/late_knobs.py``, 1 of 1 each), as did `pd.set_option("display.precision", 3)`
with each epoch's DataFrame of metrics logged (``warn_log.py --pandas``, 2 of 2). Of pandas' options,
those away from their defaults are kept; restore sets every option to the run's.

And the warnings the program was shown once per place (``graph.warned``), which a restarted
process would show again.

And torch's counter of hook handles (``RemovableHandle.next_id``): the hooks a module or an
optimizer holds are kept in dicts under the ids it gave out, and the merge gives them the run's.
The replay, which skipped the steps that registered some, counted fewer; the program's next
`register_forward_hook` (one hung for an evaluation and removed after it, as feature extractors
do) took the id of a hook the run had registered in a step, wrote over it, and its `remove()`
took both away. The counter goes on from the run's where it is behind.
"""

from __future__ import annotations

import logging
import os
import sys

from gpusnap import onimport
from gpusnap.errors import StateMismatch
from gpusnap.graph import warned

_start_environ: dict[str, str] | None = None  # os.environ as the program's code began
_start_cwd: str | None = None  # the working directory it began in
_threads_at_import: int | None = None  # what torch chose, before the program could set it


def note_start() -> None:
    """Called once by the trainee's agent, before the program's first line runs."""
    global _start_environ, _start_cwd
    _start_environ = dict(os.environ)
    _start_cwd = _cwd()
    onimport.after_import("torch", _note_torch)


def _note_torch(torch) -> None:
    global _threads_at_import
    _threads_at_import = torch.get_num_threads()


def start_cwd() -> str | None:
    return _start_cwd


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed under the program
        return None


def capture() -> dict:
    """The settings the program holds now, for the snapshot's payload (``"settings"``)."""
    out: dict = {}
    cwd = _cwd()
    if _start_cwd is not None and cwd is not None and cwd != _start_cwd:
        out["cwd"] = cwd
    if _start_environ is not None:
        now = dict(os.environ)
        changed = {k: v for k, v in now.items() if _start_environ.get(k) != v}
        removed = [k for k in _start_environ if k not in now]
        if changed or removed:
            out["environ"] = {"set": changed, "unset": removed}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):  # (not a half-imported torch)
        threads = torch.get_num_threads()
        if _threads_at_import is not None and threads != _threads_at_import:
            out["threads"] = threads
        out["default_dtype"] = str(torch.get_default_dtype()).removeprefix("torch.")
        out["matmul_precision"] = torch.get_float32_matmul_precision()
        out["deterministic"] = [torch.are_deterministic_algorithms_enabled(),
                                torch.is_deterministic_algorithms_warn_only_enabled()]
        out["hook_ids"] = torch.utils.hooks.RemovableHandle.next_id
        out["torch_print"] = dict(vars(torch._tensor_str.PRINT_OPTS))
    if (numpy := sys.modules.get("numpy")) is not None and hasattr(numpy, "get_printoptions"):
        out["numpy_print"] = numpy.get_printoptions()
    out["logging_disable"] = logging.root.manager.disable
    if (pandas := sys.modules.get("pandas")) is not None and hasattr(pandas, "get_option"):
        out["pandas_options"] = _pandas_options(pandas)
    out["warned"] = warned.capture()
    streams = {name: _kind(stream) for name in _STREAMS if (stream := getattr(sys, name)) is not getattr(sys, f"__{name}__")}
    if streams:
        out["streams"] = streams
    return out


_STREAMS = ("stdout", "stderr")


def _kind(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _known(saved: dict | None, live: dict) -> dict | None:
    """The saved options another version of the library also has, where any differs from the live ones."""
    if not saved:
        return None
    options = {k: v for k, v in saved.items() if k in live}
    return options if any(live[k] != v for k, v in options.items()) else None


def _pandas_options(pandas) -> dict:
    """pandas' options away from their defaults (deprecated ones, which warn when read, left out)."""
    config = pandas._config.config
    return {key: value for key, option in config._registered_options.items()
            if key not in config._deprecated_options and (value := pandas.get_option(key)) != option.defval}


def _put_pandas_options(pandas, saved: dict) -> list[str]:
    registered = pandas._config.config._registered_options
    live = _pandas_options(pandas)
    changed = sorted(key for key in set(saved) | set(live)
                     if key in registered and saved.get(key, registered[key].defval) != live.get(key, registered[key].defval))
    for key in changed:
        pandas.set_option(key, saved.get(key, registered[key].defval))
    return [f"pandas' {key}" for key in changed]


def check_streams(saved: dict) -> None:
    """Refuse where the run had put an object of its own in place of ``sys.stdout`` or
    ``sys.stderr`` (a Tee that also writes a log file) and the replay has not: the restarted
    run would print to the process's own stream, and its log would lack every line after the
    snapshot (``tests/programs/corpus/tee_stdout.py --late``: the lines were lost). Not kept:
    the object is the program's, but ``sys`` is no root of a snapshot."""
    for name, kind in (saved.get("streams") or {}).items():
        live = getattr(sys, name)
        if live is getattr(sys, f"__{name}__") or _kind(live) != kind:
            raise StateMismatch(f"the run had put a {kind} in place of sys.{name} in a step the replay skips, and the "
                                f"restarted run would write to {_kind(live)} instead",
                                f"replace sys.{name} before the training loop (the replay then does it again), or "
                                "log through the logging module")


def restore(saved: dict) -> list[str]:
    """Put ``saved`` (``capture``'s) back; the settings that differed, in words (not the warnings
    shown once: the program cannot tell)."""
    put = []
    if "warned" in saved:
        warned.restore(saved["warned"])
    cwd = saved.get("cwd")
    if cwd and _cwd() != cwd:
        if not os.path.isdir(cwd):
            os.makedirs(cwd)  # the run's, on a machine that has no such directory yet: it writes there
        os.chdir(cwd)
        put.append(f"working directory {cwd}")
    environ = saved.get("environ") or {}
    for name, value in environ.get("set", {}).items():
        if os.environ.get(name) != value:
            os.environ[name] = value
            put.append(f"${name}")
    for name in environ.get("unset", []):
        if os.environ.pop(name, None) is not None:
            put.append(f"${name} (unset)")
    if (level := saved.get("logging_disable", logging.root.manager.disable)) != logging.root.manager.disable:
        logging.disable(level)
        put.append(f"logging.disable({logging.getLevelName(level)})")
    numpy = sys.modules.get("numpy")
    if numpy is not None and (options := _known(saved.get("numpy_print"), numpy.get_printoptions())) is not None:
        numpy.set_printoptions(**options)
        put.append("NumPy's print options")
    pandas = sys.modules.get("pandas")
    if pandas is not None and "pandas_options" in saved and hasattr(pandas, "get_option"):
        put += _put_pandas_options(pandas, saved["pandas_options"])
    torch = sys.modules.get("torch")
    if torch is None or "default_dtype" not in saved:
        return put
    if (options := _known(saved.get("torch_print"), vars(torch._tensor_str.PRINT_OPTS))) is not None:
        torch.set_printoptions(**options)
        put.append("torch's print options")
    if "threads" in saved and torch.get_num_threads() != saved["threads"]:
        torch.set_num_threads(saved["threads"])
        put.append(f"{saved['threads']} intra-op threads")
    dtype = getattr(torch, saved["default_dtype"])
    if torch.get_default_dtype() != dtype:
        torch.set_default_dtype(dtype)
        put.append(f"default dtype {saved['default_dtype']}")
    if torch.get_float32_matmul_precision() != saved["matmul_precision"]:
        torch.set_float32_matmul_precision(saved["matmul_precision"])
        put.append(f"float32 matmul precision {saved['matmul_precision']}")
    mode, warn_only = saved["deterministic"]
    if [torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()] != [mode, warn_only]:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
        put.append("deterministic algorithms " + ("on" if mode else "off"))
    handles = torch.utils.hooks.RemovableHandle
    if saved.get("hook_ids", 0) > handles.next_id:  # (not said: the program cannot tell)
        handles.next_id = saved["hook_ids"]
    return put
