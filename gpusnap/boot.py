"""Trainee entry point: ``python -m gpusnap.boot SCRIPT [ARGS...]`` or ``... -m MODULE [ARGS...]``.

Runs the program as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would (``sys.argv``,
``sys.path[0]``, ``__main__``'s namespace, exit status, tracebacks), with its loops instrumented.
Configuration comes from the environment variable ``GPUSNAP_BOOT``, a JSON object (absent: ``{}``);
boot itself reads ``"instrument"`` (a list of paths and dotted module names) and hands the whole
object to ``gpusnap.capture.trainee.agent.install``. In order, boot:

1. sets ``sys.argv`` and ``sys.path[0]`` as python would;
2. installs the raw-allocation registry (``device.tracking``; the fake GPU first when
   ``GPUSNAP_DEVICE=fake``), loads ``gpusnap.frameworks`` (the framework loop modules to instrument, their adapters) and
   installs the import hook (``instrument.importer``), rooted at the script's directory;
3. compiles the main code, instrumented, and makes a fresh ``__main__`` module;
4. records ``loops.MAIN_CODE`` / ``loops.MAIN_GLOBALS`` for the capture side;
5. calls ``capture.trainee.agent.install(config)``, then, on a restart, ``restore.replay.install``
   (capture never imports restore: boot hands each what it needs of the other);
6. runs the main code.

Nothing heavy is imported before the user's code (no torch): start-up cost is the hook itself.
"""

import os
import sys

_USAGE = "usage: python -m gpusnap.boot SCRIPT [ARGS...] | -m MODULE [ARGS...]"
_BOOT_FILE = __file__
_sigint_at_exit = False


def _fail(message: str, status: int):
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    raise SystemExit(status)


def read_config() -> dict:
    raw = os.environ.get("GPUSNAP_BOOT", "").strip()
    if not raw:
        return {}
    import json

    try:
        config = json.loads(raw)
    except ValueError as exc:
        _fail(f"gpusnap.boot: GPUSNAP_BOOT is not valid JSON: {exc}", 2)
    if not isinstance(config, dict):
        _fail("gpusnap.boot: GPUSNAP_BOOT must be a JSON object", 2)
    return config


def _script_main(script: str, args: list):
    """(code, namespace, root) for ``python SCRIPT``."""
    from importlib.machinery import SourceFileLoader

    from gpusnap.instrument import importer

    path = os.path.abspath(script)
    sys.argv[:] = [script, *args]
    if not sys.flags.safe_path:
        # `python -m gpusnap.boot` put the cwd first; `python SCRIPT` puts the script's
        # directory there instead, symlinks resolved.
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    if os.path.isdir(path):
        _fail(f"gpusnap.boot: {script!r} is a directory; run its package with -m instead", 2)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        _fail(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}", 2)
    namespace = {"__loader__": SourceFileLoader("__main__", path), "__spec__": None}
    return (lambda: importer.compile_module(data, path)), namespace, path, None


def _find_main_spec(name: str):
    import importlib.util

    if name.startswith("."):
        _fail(f"{sys.executable}: Relative module names not supported", 1)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        msg = f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
        _fail(f"{sys.executable}: {msg}", 1)
    if spec is None:
        _fail(f"{sys.executable}: No module named {name}", 1)
    if spec.submodule_search_locations is not None:
        if name == "__main__" or name.endswith(".__main__"):
            _fail(f"{sys.executable}: Cannot use package as __main__ module", 1)
        main_name = name + ".__main__"
        try:
            main_spec = importlib.util.find_spec(main_name)
        except ImportError:
            main_spec = None
        if main_spec is None:
            _fail(f"{sys.executable}: No module named {main_name}; {name!r} is a package and cannot be directly executed", 1)
        return main_spec
    return spec


def _module_main(name: str, args: list):
    """(code, namespace, root) for ``python -m MODULE``."""
    from gpusnap.instrument import importer

    # python shows "-m" as argv[0] while it imports the parent packages.
    sys.argv[:] = ["-m", *args]
    spec = _find_main_spec(name)
    origin = spec.origin
    sys.argv[0] = origin if origin else "-m"
    namespace = {"__loader__": spec.loader, "__spec__": spec, "__package__": spec.parent}

    def compile_main():
        if origin and origin.endswith(".py") and hasattr(spec.loader, "get_data"):
            return importer.compile_module(spec.loader.get_data(origin), origin)
        # No source (sourceless .pyc, extension): run it as python would, uninstrumented.
        code = spec.loader.get_code(spec.name)
        if code is None:
            _fail(f"{sys.executable}: No code object available for {spec.name}", 1)
        return code

    return compile_main, namespace, origin, spec.cached if spec.has_location else None


def _trimmed(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == _BOOT_FILE:
        tb = tb.tb_next
    return tb


def _report_uncaught(exc: BaseException) -> None:
    """What python does with an exception that leaves ``__main__``, minus boot's own frames."""
    global _sigint_at_exit
    tb = _trimmed(exc.__traceback__)
    exc = exc.with_traceback(tb)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException as hook_exc:  # noqa: BLE001 - python reports a failing hook the same way
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_exc), hook_exc, _trimmed(hook_exc.__traceback__))
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, tb)
    if isinstance(exc, KeyboardInterrupt):
        _sigint_at_exit = True


def _exit_by_sigint() -> None:
    # python ends a program that a KeyboardInterrupt escaped by killing itself with SIGINT after
    # finalization, so that the parent sees a signal death (-2, shell status 130). This handler
    # is registered before any user code, so it runs after the user's atexit handlers.
    if not _sigint_at_exit:
        return
    import signal

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the status from being right
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def main(argv=None) -> None:
    import atexit

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        _fail(_USAGE, 2 if not argv else 0)
    config = read_config()
    if argv[0] == "-m":
        if len(argv) < 2:
            _fail("Argument expected for the -m option\n" + _USAGE, 2)
        target = argv[1]
        make = _module_main
        args = argv[2:]
    else:
        target = argv[0]
        make = _script_main
        args = argv[1:]

    from gpusnap.instrument import importer, loops

    instrument = config.get("instrument") or []
    if isinstance(instrument, str):
        instrument = [instrument]
    if make is _script_main:
        root = os.path.dirname(os.path.abspath(target))
    else:
        root = os.getcwd() if sys.flags.safe_path or not sys.path else sys.path[0]
    from gpusnap import frameworks
    from gpusnap.device import tracking

    tracking.install()  # raw cuda-python allocations, before the program can import the bindings
    frameworks.load()  # before any import of the program's: they name modules to instrument
    importer.install(roots=[root], instrument=[*instrument, *frameworks.loop_modules()])
    compile_main, extra, filename, cached = make(target, args)
    try:
        code = compile_main()
    except (SyntaxError, ValueError) as exc:
        # python reports a program that does not compile without a traceback.
        _report_uncaught(exc.with_traceback(None))
        raise SystemExit(1) from None

    old_main = sys.modules.get("__main__")
    module = type(sys)("__main__")
    namespace = module.__dict__
    namespace.update(extra)
    if old_main is not None and "__annotations__" in vars(old_main):
        namespace["__annotations__"] = {}
    import builtins

    namespace["__builtins__"] = builtins
    namespace["__file__"] = filename
    namespace["__cached__"] = cached
    importer.bind_runtime(namespace)
    sys.modules["__main__"] = module

    loops.MAIN_CODE = code
    loops.MAIN_GLOBALS = namespace
    atexit.register(_exit_by_sigint)

    from gpusnap.capture.trainee import agent
    from gpusnap.restore import fastforward

    agent.install(config, note_source=fastforward.describe)
    resuming = agent.resuming()
    if resuming is not None:
        from gpusnap.restore import replay

        replay.install(*resuming, config, agent.emit, agent.resumed, agent.restore_device, agent.before_merge,
                       agent.write_device, agent.flush_events)
    _run(code, namespace)


def _run(code, namespace) -> None:
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - this is the program's top level
        _report_uncaught(exc)
        raise SystemExit(1) from None


if __name__ == "__main__":
    # Run from the real module, so that boot's frames and globals are not the program's __main__.
    from gpusnap.boot import main as _main

    _main()
