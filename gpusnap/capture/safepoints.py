"""Which loop boundaries replay can return to, and which loop runs the optimizer steps.

Replay rebuilds the call stack by running the program again, so a snapshot may only be taken
where every frame from the script's module frame down to the loop runs instrumented code:
replay fast-forwards those loops and re-enters those calls. A boundary inside a model's forward
called back from ``torch.optim`` (LBFGS's closure), inside a generator being iterated, or below
any library frame is not such a place.
"""

from __future__ import annotations

import ast
import linecache
import os

from gpusnap.instrument import loops

_returnable: dict[object, bool] = {}  # code object -> its frames may lie on a snapshot's path
_GPUSNAP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _instrumented(code) -> bool:
    known = _returnable.get(code)
    if known is None:
        from gpusnap.instrument.importer import SOURCES

        known = _returnable[code] = code is loops.MAIN_CODE or code.co_filename in SOURCES
    return known


def returnable(frame) -> bool:
    """True when every frame from the main module frame down to ``frame`` is instrumented."""
    main = loops.MAIN_CODE
    while frame is not None:
        if not _instrumented(frame.f_code):
            return False
        if frame.f_code is main:
            return True
        frame = frame.f_back
    return main is None  # no main frame recorded (a bare test harness): nothing to compare with


def uninstrumented_step_loop(frame) -> tuple[str, list[str]] | None:
    """Where the optimizer step called from ``frame`` sits inside a loop of code that is not
    instrumented (below the innermost instrumented frame), or is reached through such code:
    ("file:line (function)", the modules that would have to be instrumented for that loop's
    boundaries to be safe points, outermost first)."""
    torch_dir = _torch_dir()
    where = None
    modules: list[str] = []
    while frame is not None:
        code = frame.f_code
        if _instrumented(code):
            break
        path = code.co_filename
        inside_tools = path.startswith(_GPUSNAP_DIR) or (torch_dir is not None and path.startswith(torch_dir))
        if where is None and not inside_tools and _inside_loop(path, frame.f_lineno):
            where = f"{os.path.normpath(path)}:{frame.f_lineno} ({code.co_qualname})"
        if where is not None:
            module = frame.f_globals.get("__name__") or os.path.splitext(os.path.basename(path))[0]
            if module not in modules:
                modules.insert(0, module)
        frame = frame.f_back
    if where is None and frame is not None:
        return _uninstrumented_caller(frame)
    return (where, modules) if where is not None and frame is not None else None


def _uninstrumented_caller(frame) -> tuple[str, list[str]] | None:
    """The step loop's own code is instrumented, but a call on the way to it from the main
    module is not (a library's wrapper, a retry loop): its boundaries are no safe points either.
    ("file:line (function)" of the outermost such call, the modules that would cover them)."""
    step_at = f"{os.path.normpath(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_qualname})"
    where, modules = None, []
    while frame is not None and frame.f_code is not loops.MAIN_CODE:
        code = frame.f_code
        if not _instrumented(code) and not code.co_filename.startswith(_GPUSNAP_DIR):
            where = f"{os.path.normpath(code.co_filename)}:{frame.f_lineno} ({code.co_qualname})"
            module = frame.f_globals.get("__name__") or os.path.splitext(os.path.basename(code.co_filename))[0]
            if module not in modules:
                modules.insert(0, module)
        frame = frame.f_back
    return (f"{step_at}, called through {where}", modules) if where is not None and frame is not None else None


def _torch_dir() -> str | None:
    import sys

    torch = sys.modules.get("torch")
    return os.path.dirname(torch.__file__) if torch is not None and getattr(torch, "__file__", None) else None


def _inside_loop(path: str, line: int) -> bool:
    """Is ``line`` of the file at ``path`` inside a ``for`` or ``while`` statement?"""
    source = "".join(linecache.getlines(path))
    if not source:
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.lineno <= line <= (node.end_lineno or node.lineno)
        for node in ast.walk(tree)
    )
