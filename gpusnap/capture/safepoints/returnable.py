"""Which loop boundaries replay can return to, and which loop runs the optimizer steps.

Replay rebuilds the call stack by running the program again, so a snapshot may only be taken
where every frame from the script's module frame down to the loop runs instrumented code:
replay fast-forwards those loops and re-enters those calls. A boundary inside a model's forward
called back from ``torch.optim`` (LBFGS's closure), inside a generator being iterated, or below
any library frame is not such a place; nor is any boundary inside a coroutine (an ``async def``
an event loop drives): replay cannot bring suspended coroutines back, even where the event
loop's modules are instrumented.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import sys

from gpusnap.instrument import loops

_returnable: dict[object, bool] = {}  # code object -> its frames may lie on a snapshot's path
_GPUSNAP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _instrumented(code) -> bool:
    known = _returnable.get(code)
    if known is None:
        from gpusnap.instrument.importer import SOURCES

        known = _returnable[code] = code is loops.MAIN_CODE or code.co_filename in SOURCES
    return known


def instrumented(code) -> bool:
    """Is ``code`` the script's or an instrumented module's?"""
    return _instrumented(code)


def returnable(frame) -> bool:
    """True when every frame from the main module frame down to ``frame`` is instrumented, none
    is a coroutine's, and no event loop is running (its tasks' coroutines wait, suspended)."""
    if _event_loop_running():
        return False
    main = loops.MAIN_CODE
    while frame is not None:
        if not _instrumented(frame.f_code) or frame.f_code.co_flags & _ASYNC_FLAGS:
            return False
        if frame.f_code is main:
            return True
        frame = frame.f_back
    return main is None  # no main frame recorded (a bare test harness): nothing to compare with


def _event_loop_running() -> bool:
    events = sys.modules.get("asyncio.events")
    return events is not None and events._get_running_loop() is not None


def coroutine_on_path(frame) -> str | None:
    """The innermost coroutine's frame from ``frame`` up, as "file:line (function)"; None if none."""
    while frame is not None:
        code = frame.f_code
        if code.co_flags & _ASYNC_FLAGS:
            return f"{os.path.normpath(code.co_filename)}:{frame.f_lineno} ({code.co_qualname})"
        frame = frame.f_back
    return None


def uninstrumented_step_loop(frame) -> tuple[str, list[str]] | None:
    """Where the optimizer step called from ``frame`` cannot be snapshotted at its loop's
    boundaries: ("file:line (function)", the modules that would have to be instrumented, outermost
    first), or None when it can.

    The loop that steps is the innermost one around the call: a running instrumented loop, or a
    ``for``/``while`` of code that is not instrumented (a trainer in site-packages). Frames below
    it (a framework's optimization helpers between its loop and ``optimizer.step``) are gone by
    the loop's next boundary and do not matter; every frame above it, up to the script's, must be
    instrumented for replay to return there."""
    torch_dir = _torch_dir()
    running = {id(loop.frame) for loop in loops.ACTIVE if loop.frame.f_back is not None}
    where, stepping = None, None
    while frame is not None:
        code = frame.f_code
        if id(frame) in running:
            stepping = frame  # an instrumented step loop: check the calls above it
            break
        path = code.co_filename
        inside_tools = path.startswith(_GPUSNAP_DIR) or (torch_dir is not None and path.startswith(torch_dir))
        if not _instrumented(code) and not inside_tools and _inside_loop(path, frame.f_lineno):
            where, stepping = f"{os.path.normpath(path)}:{frame.f_lineno} ({code.co_qualname})", frame
            break
        frame = frame.f_back
    modules = _uninstrumented_modules(stepping) if stepping is not None else None
    if modules is None:  # no step loop, or no script frame above it (a bare test harness)
        return None
    if where is not None:
        return where, modules
    if not modules:
        return None
    code = stepping.f_code
    step_at = f"{os.path.normpath(code.co_filename)}:{stepping.f_lineno} ({code.co_qualname})"
    return f"{step_at}, called through {_outermost_uninstrumented(stepping)}", modules


def _uninstrumented_modules(frame) -> list[str] | None:
    """Modules of the frames from ``frame`` up to the script's that are not instrumented (and
    not gpusnap's own), outermost first; None when the script's frame is not above it."""
    modules: list[str] = []
    while frame is not None and frame.f_code is not loops.MAIN_CODE:
        code = frame.f_code
        if not _instrumented(code) and not code.co_filename.startswith(_GPUSNAP_DIR):
            module = frame.f_globals.get("__name__") or os.path.splitext(os.path.basename(code.co_filename))[0]
            if module not in modules:
                modules.insert(0, module)
        frame = frame.f_back
    return modules if frame is not None else None


def _outermost_uninstrumented(frame) -> str:
    found = None
    while frame is not None and frame.f_code is not loops.MAIN_CODE:
        code = frame.f_code
        if not _instrumented(code) and not code.co_filename.startswith(_GPUSNAP_DIR):
            found = f"{os.path.normpath(code.co_filename)}:{frame.f_lineno} ({code.co_qualname})"
        frame = frame.f_back
    return found


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
