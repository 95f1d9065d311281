"""The roots of a snapshot: frames on the path, module globals, RNG states, loop positions.

Collected in the forked writer from its copy-on-write image of the trainee, so the trainee pays
nothing for it. The pickled payload is a plain dict (format below) so that restore can align it
with the replayed program by path::

    {"frames":  [{"file", "function", "firstlineno", "line", "locals": {name: value}}, ...],
     "globals": {module name: {name: value}},
     "statics": {module name: {class or function name: {attribute: value}}},
     "torch_hooks": {name: value} (torch's process-wide module and optimizer hooks),
     "loggers": {name: {"level", "propagate", "disabled", "handlers"}} (``loggers()``),
     "exits":   [(func, args, kwargs, where its loops stood)] (what the program registered with
                 atexit in a step: ``graph.exits``),
     "rng":     {"random": ..., "numpy": ..., "torch": ..., "torch.cuda": ...},
     "loops":   [{"frame": index into frames, "loop_id": "LINE:COL", "index": n,
                  "kind": "for"|"while", "resume": {...} | None,
                  ... and what ``loop_record(loop)`` adds: "rng_at", "check"}, ...]}

Frames run from the ``__main__`` module frame (whose locals are its globals, so they are stored
once, under ``globals``) down to the frame of the loop whose boundary is the safe point.

``statics`` is the state a program keeps on the classes and functions its modules define, which
pickle by name and so hold nothing of it: a class attribute the loop counts up (``Net.steps +=
1``), an attribute set on a function (``log.calls``), a mutable default argument used as a cache
or running statistic (``def weigh(x, stats={})``, a method's ``def smooth(self, x, seen=[])``,
keyed ``Class.method``), and the entries of the program's ``functools`` caches (a getter's
singleton, ``graph.caches``). Methods, nested classes, descriptors, dunder names and an ABC's
registry (``_abc_impl``) are definitions, not state. A closure the program's code made and bound
to a global (``tick = make_counter()``, its count in a cell) is kept with the globals: its cells
are state.

``torch_hooks`` are the hooks ``torch.nn.modules.module.register_module_forward_hook`` and its
siblings hold for every module, and ``torch.optim.optimizer.register_optimizer_step_post_hook``
and its sibling for every optimizer: dicts (and one flag) in those modules' globals, which no
object the program holds carries. A hook registered so in a step the replay skips was lost, and a
count it kept of every layer's outputs, or of every optimizer step, restarted "verified" to other
final state (``tests/programs/corpus/global_hooks.py``, 3 of 3 each). gpusnap's own optimizer
hooks are among them: functions of its modules, which pickle by name and merge as themselves.
"""

from __future__ import annotations

import sys
import types

from gpusnap.graph import caches, exits
from gpusnap.instrument import loops, transform

_DEFINITIONS = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, caches.ProgramCache)


def frames_on_path(innermost) -> list:
    """Frames from the main module frame down to ``innermost``, outermost first."""
    main_code = getattr(loops, "MAIN_CODE", None)
    path = []
    frame = innermost
    while frame is not None:
        path.append(frame)
        if frame.f_code is main_code:
            break
        frame = frame.f_back
    else:
        # No main frame recorded (a bare test harness): keep the frames below gpusnap's own.
        package_dir = loops.__file__.rsplit("/", 2)[0]
        while path and path[-1].f_code.co_filename.startswith(package_dir):
            path.pop()
    path.reverse()
    return path


def frame_cells(frames: list) -> dict[int, tuple[int, str]]:
    """{id(cell): (index in ``frames``, variable)} of the closure cells of the frames, as
    ``instrument.transform`` keeps them reachable: a local function whose cell is one of these
    was made over that frame's variable, and is made again over the replay's."""
    found = {}
    for i, frame in enumerate(frames):
        for name, cell in cells_of(frame).items():
            found.setdefault(id(cell), (i, name))
    return found


def cells_of(frame) -> dict:
    """{variable: cell} of ``frame``'s closure cells, as ``instrument.transform`` keeps them in
    ``__gpusnap_cells__``; empty for a frame of code it did not instrument, or without cells."""
    keeper = frame.f_locals.get(transform.CELLS_NAME)
    if not isinstance(keeper, types.FunctionType):
        return {}
    return dict(zip(keeper.__code__.co_freevars, keeper.__closure__ or ()))


def _keep_local(name: str) -> bool:
    return "__gpusnap_" not in name


def _keep_global(name: str, value, own_files) -> bool:
    # Dunder names are the module's own; other names with a leading "__" are installed by tools
    # (torch.compile's `__builtins_dict___0`, `__compiled_fn_3`), which refuse to find them taken.
    if name.startswith("__") or "__gpusnap_" in name:
        return False
    if isinstance(value, types.FunctionType) and value.__closure__ and value.__code__.co_filename in own_files:
        return True  # a closure the program made (`tick = make_counter()`): its cells are state
    return not isinstance(value, _DEFINITIONS)


def _statics(module: str, namespace: dict) -> dict:
    """{name: {attribute: value}} of the state on the classes and functions ``module`` defines."""
    found = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") or getattr(value, "__module__", None) != module:
            continue
        if isinstance(value, type):
            owners = [(name, class_state(value))]
            owners += [(f"{name}.{method}", _function_state(func)) for method, func in _methods(value)]
        elif isinstance(value, (types.FunctionType, caches.ProgramCache)):
            owners = [(name, _function_state(value))]
        else:
            continue
        found.update({owner: state for owner, state in owners if state})
    return found


def _methods(cls: type) -> list:
    """(name, function) of the methods the class's own module defined in it, static and class
    methods unwrapped (an Enum's ``__new__`` is the enum module's, with a library's marks on it);
    a cached method's ``ProgramCache`` among them."""
    found = []
    for name, value in vars(cls).items():
        func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if isinstance(func, (types.FunctionType, caches.ProgramCache)) and func.__module__ == cls.__module__:
            found.append((name, func))
    return found


def owner_at(namespace: dict, name: str):
    """The class or function a ``statics`` entry names (``Net``, ``Net.update``), or None."""
    first, _, method = name.partition(".")
    owner = namespace.get(first)
    if method and owner is not None:
        owner = vars(owner).get(method) if isinstance(owner, type) else None
        owner = owner.__func__ if isinstance(owner, (staticmethod, classmethod)) else owner
    return owner


def class_state(cls: type) -> dict:
    """{attribute: value} of what a class holds that is no definition."""
    import enum

    if issubclass(cls, enum.Enum):
        return {}  # its members are definitions, pickled by name
    return {name: value for name, value in vars(cls).items()
            if not name.startswith("__") and "__gpusnap_" not in name and name != "_abc_impl" and not _definition(value)}


def _function_state(func) -> dict:
    """A function's attributes and changeable defaults; a ``ProgramCache``'s attributes are its
    entries and counts (it has no defaults)."""
    state = {name: value for name, value in vars(func).items() if not name.startswith("__")}
    if getattr(func, "__defaults__", None) and not all(map(_immutable, func.__defaults__)):
        state["__defaults__"] = func.__defaults__
    if getattr(func, "__kwdefaults__", None) and not all(map(_immutable, func.__kwdefaults__.values())):
        state["__kwdefaults__"] = func.__kwdefaults__
    return state


def _definition(value) -> bool:
    """A method, property or other descriptor (its type has ``__get__``), a class, a module."""
    return isinstance(value, (type, types.ModuleType)) or hasattr(type(value), "__get__")


def _immutable(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes, frozenset, range, type,
                                               types.FunctionType, types.BuiltinFunctionType, types.ModuleType)) \
        or (isinstance(value, tuple) and all(map(_immutable, value)))


def instrumented_sources() -> dict:
    """{absolute path: digest} of the program's own sources, the main script's among them."""
    try:
        from gpusnap.instrument.importer import SOURCES
    except ImportError:
        return {}
    return SOURCES


def instrumented_modules() -> dict[str, dict]:
    """{module name: globals dict} for ``__main__`` and every instrumented user module."""
    found: dict[str, dict] = {}
    main_globals = getattr(loops, "MAIN_GLOBALS", None)
    if main_globals is not None:
        found["__main__"] = main_globals
    SOURCES = instrumented_sources()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path in SOURCES and name != "__main__" and isinstance(getattr(module, "__dict__", None), dict) and not _alias(name, module):
            found[name] = module.__dict__
    return found


def _alias(name: str, module) -> bool:
    """Is ``sys.modules[name]`` a module held under another name too? ``multiprocess`` (the one
    Hugging Face ``datasets`` uses) puts the script's module at ``__mp_main__`` when first
    imported, which a replay that has not imported it yet could not import by that name."""
    real = getattr(module, "__name__", name)
    return module.__dict__ is getattr(loops, "MAIN_GLOBALS", None) or (real != name and sys.modules.get(real) is module)


# Where torch keeps the hooks it calls for every module and every optimizer. Their ``_global_*``
# names differ across the two, so the payload keeps them by name alone (as it did with one).
TORCH_HOOK_MODULES = ("torch.nn.modules.module", "torch.optim.optimizer")


def torch_hooks() -> dict:
    """torch's process-wide hooks, as its modules hold them now (none without torch)."""
    return {name: value for module in _torch_hook_modules() for name, value in vars(module).items() if name.startswith("_global_")}


def set_torch_hook(name: str, value) -> None:
    """Put ``value`` back where torch keeps the process-wide hook state called ``name`` (nowhere
    where this torch keeps none by that name)."""
    owner = next((m for m in _torch_hook_modules() if hasattr(m, name)), None)
    if owner is not None:
        setattr(owner, name, value)


def _torch_hook_modules() -> list:
    return [module for name in TORCH_HOOK_MODULES if (module := sys.modules.get(name)) is not None]


def loggers() -> dict:
    """The loggers as the program set them up, which the logging module's own registry holds and
    no object of the program's carries (a logger pickles by its name): {name: {"level",
    "propagate", "disabled", "handlers"}}, the root logger's under "" (none where logging is not
    imported). A FileHandler added at a phase change was gone after a restart, and its log lost
    every line after the snapshot (``tests/programs/corpus/late_logger.py``, "verified", 2 of 3)."""
    logging = sys.modules.get("logging")
    if logging is None:
        return {}
    found = {}
    for name, logger in [("", logging.root), *list(logging.Logger.manager.loggerDict.items())]:
        if isinstance(logger, logging.Logger):
            found[name] = {"level": logger.level, "propagate": logger.propagate, "disabled": logger.disabled,
                           "handlers": logger.handlers}
    return found


def live_loggers(names) -> dict:
    """``loggers()``'s entries for ``names`` in this process, each logger made where missing."""
    import logging

    for name in names:
        logging.getLogger(name or None)  # (the one there, or a new one as the run made it)
    return loggers()


def set_logger(name: str, config: dict) -> None:
    import logging

    logger = logging.getLogger(name or None)
    logger.setLevel(config["level"])
    logger.propagate, logger.disabled, logger.handlers = config["propagate"], config["disabled"], config["handlers"]


def collect(innermost_frame, active_loops: list, rng_states: dict, loop_record=None, loop_ahead=None, settings=None) -> dict:
    """The payload; ``loop_record(loop)`` adds to each loop's entry, ``loop_ahead(loop)`` gives
    what the loop's source fetched ahead of the item the loop holds (payload ``"ahead"``, by
    loop index: the pickler keeps its data, restore writes it into the replay's source). The
    DataLoaders each loop iterates (``ActiveLoop.loaders``) go in payload ``"loaders"``, by loop
    index: restore tells whether the replay's loop iterates their counterparts. ``settings``
    (``graph.settings.capture()``) go in payload ``"settings"``."""
    frames = frames_on_path(innermost_frame)
    main_code = getattr(loops, "MAIN_CODE", None)
    frame_entries = []
    for frame in frames:
        code = frame.f_code
        is_module = code is main_code or code.co_name == "<module>"
        local_vars = {} if is_module else {k: v for k, v in dict(frame.f_locals).items() if _keep_local(k)}
        frame_entries.append(
            {
                "file": code.co_filename,
                "function": code.co_qualname,
                "firstlineno": code.co_firstlineno,
                "line": frame.f_lineno,
                "locals": local_vars,
            }
        )
    own_files, modules = instrumented_sources(), instrumented_modules()
    module_globals = {name: {k: v for k, v in list(g.items()) if _keep_global(k, v, own_files)} for name, g in modules.items()}
    index_of = {id(f): i for i, f in enumerate(frames)}
    loop_entries = []
    ahead, loaders = {}, {}
    for loop in active_loops:
        if id(loop.frame) not in index_of:
            continue
        entry = {
            "frame": index_of[id(loop.frame)],
            "loop_id": loop.loop_id,
            "index": loop.index,
            "kind": loop.kind,
            "resume": getattr(loop, "resume", None),
        }
        if loop_record is not None:
            entry.update(loop_record(loop))
        if loop_ahead is not None and (source := loop_ahead(loop)) is not None:
            ahead[len(loop_entries)] = source
        if getattr(loop, "loaders", None):
            loaders[len(loop_entries)] = loop.loaders
        loop_entries.append(entry)
    statics = {name: found for name, namespace in modules.items() if (found := _statics(name, namespace))}
    payload = {"frames": frame_entries, "globals": module_globals, "statics": statics, "rng": rng_states, "loops": loop_entries}
    if hooks := torch_hooks():
        payload["torch_hooks"] = hooks
    if logs := loggers():
        payload["loggers"] = logs
    if exits.registered:
        payload["exits"] = exits.registered
    if settings:
        payload["settings"] = settings
    if ahead:
        payload["ahead"] = ahead
    if loaders:
        payload["loaders"] = loaders
    return payload


def named_roots(roots: dict) -> list[tuple[str, object]]:
    """(path, value) of every top-level root value, in the order paths are assigned."""
    named: list[tuple[str, object]] = []
    for module, values in roots["globals"].items():
        named += [(f"globals[{module}].{k}", v) for k, v in values.items()]
    for module, owners in (roots.get("statics") or {}).items():
        named += [(f"statics[{module}].{owner}.{k}", v) for owner, values in owners.items() for k, v in values.items()]
    for i, frame in enumerate(roots["frames"]):
        named += [(f"frame[{i}].locals.{k}", v) for k, v in frame["locals"].items()]
    named += [(f"torch_hooks.{k}", v) for k, v in (roots.get("torch_hooks") or {}).items()]
    named += [(f"loggers[{k!r}]", v) for k, v in (roots.get("loggers") or {}).items()]
    named += [(f"exits[{i}]", v) for i, v in enumerate(roots.get("exits") or ())]
    named += [(f"loops[{i}].source", v) for i, v in (roots.get("ahead") or {}).items()]
    named += [(f"loops[{i}].loaders", v) for i, v in (roots.get("loaders") or {}).items()]
    return named
