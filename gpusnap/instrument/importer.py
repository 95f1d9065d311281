"""Import hook that instruments the user's modules.

``install(roots, instrument)`` puts an ``InstrumentFinder`` into ``sys.meta_path`` just before
``PathFinder`` (so builtin and frozen modules, and finders that others put first, keep
precedence). It asks ``PathFinder`` for the spec and, when the module is the user's, swaps the
spec's ``SourceFileLoader`` for an ``InstrumentingLoader``; any other spec is returned as found,
so uninstrumented imports cost one lookup, as without the hook.

A module is the user's when its name is, or is inside, a module named by ``--instrument`` (boot
adds the known frameworks' step-loop modules, ``gpusnap.frameworks.loop_modules()``); or
its file is under a path named by ``--instrument``; or its file is under a root (the main
script's directory) and not in site-packages / dist-packages, the standard library or gpusnap.

``SOURCES`` maps the absolute path of every instrumented source (the main script too) to the
xxh3-128 hex digest of its bytes: the run identity uses it to refuse a changed program.
"""

from __future__ import annotations

import os
import sys
from importlib import _bootstrap
from importlib.machinery import PathFinder, SourceFileLoader

import xxhash

from gpusnap.instrument import cache, loops, transform
from gpusnap.sources import library_file, real, under

SOURCES: dict[str, str] = {}



def compile_module(data: bytes, path: str):
    """Instrumented code object for the source ``data`` read from ``path``; registers the
    source in ``SOURCES`` and goes through the code cache."""
    digest = xxhash.xxh3_128_hexdigest(data)
    SOURCES[path] = digest
    entry = cache.key(path, digest, transform.VERSION)
    code = cache.load(entry)
    if code is None:
        code = transform.compile_instrumented(data, path)
        cache.store(entry, code)
    return code


def bind_runtime(namespace: dict) -> None:
    """Make ``namespace`` ready to run instrumented code."""
    namespace[transform.LOOPS_NAME] = loops


# CPython drops frames whose file is importlib's from tracebacks of failed imports, up to a call
# of `_call_with_frames_removed`. get_code is compiled under that file name so that a syntax
# error in a user module shows exactly what plain python shows, not gpusnap's and ast's frames.
_GET_CODE = """
def get_code(self, fullname):
    path = self.get_filename(fullname)
    data = self.get_data(path)
    try:
        return compile_module(data, path)
    except (SyntaxError, ValueError):
        pass
    # Raise the same error again, the way SourceLoader does, with no gpusnap frame below.
    return _call_with_frames_removed(compile, data, path, "exec", dont_inherit=True)
"""
_get_code_ns = {"compile_module": compile_module, "_call_with_frames_removed": _bootstrap._call_with_frames_removed}
exec(compile(_GET_CODE, "<frozen importlib._bootstrap_external>", "exec"), _get_code_ns)


class InstrumentingLoader(SourceFileLoader):
    """A ``SourceFileLoader`` whose code is instrumented; it neither reads nor writes
    ``__pycache__``. ``exec_module`` is the stock one (so runtime errors in module code show
    python's usual traceback); the module gets ``__gpusnap_loops__`` when it is created."""

    get_code = _get_code_ns["get_code"]

    def create_module(self, spec):
        module = type(sys)(spec.name)
        bind_runtime(module.__dict__)
        return module

    def source_to_code(self, data, path, *, _optimize=-1):
        return transform.compile_instrumented(data, path)

    def set_data(self, path, data, *, _mode=0o666):
        return None


class Policy:
    """Decides which modules are the user's (see the module docstring)."""

    def __init__(self, roots=(), paths=(), names=()):
        self.roots = tuple(real(p) for p in roots)
        self.paths = tuple(real(p) for p in paths)
        self.names = tuple(names)

    @classmethod
    def from_config(cls, roots, instrument) -> Policy:
        """``instrument`` entries are paths (they contain a separator, end in ``.py`` or exist)
        or dotted module names; an entry that is both counts as both."""
        paths, names = [], []
        for entry in instrument:
            entry = str(entry)
            is_name = not entry.endswith(".py") and all(p.isidentifier() for p in entry.split("."))
            if not is_name or os.sep in entry or "/" in entry or os.path.exists(entry):
                paths.append(os.path.abspath(entry))
            if is_name:
                names.append(entry)
        return cls(roots=roots, paths=paths, names=names)

    def wants(self, fullname: str, filename: str) -> bool:
        for name in self.names:
            if fullname == name or fullname.startswith(name + "."):
                return True
        path = real(filename)
        if under(path, self.paths):
            return True
        return under(path, self.roots) and not library_file(path)


class InstrumentFinder:
    def __init__(self, policy: Policy):
        self.policy = policy

    def find_spec(self, fullname, path=None, target=None):
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is SourceFileLoader and spec.origin:
            if self.policy.wants(fullname, spec.origin):
                spec.loader = InstrumentingLoader(fullname, spec.origin)
        return spec

    def invalidate_caches(self):
        return None


def install(roots=(), instrument=()) -> InstrumentFinder:
    """Install the hook (once; a second call replaces the first)."""
    uninstall()
    # Framework trainers' loop modules are instrumented whenever the program imports them.
    finder = InstrumentFinder(Policy.from_config(roots, instrument))
    try:
        at = sys.meta_path.index(PathFinder)
    except ValueError:
        at = len(sys.meta_path)
    sys.meta_path.insert(at, finder)
    return finder


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, InstrumentFinder)]
