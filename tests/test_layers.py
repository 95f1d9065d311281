"""The package's imports follow the dependency rules of docs/architecture.md: imports run down
the pipeline, never back. Every import statement counts, in every form (``import gpusnap.x``,
``from gpusnap import x``, ``from gpusnap.x import y``, relative ``from ..x import y``) and
wherever it stands (a lazy import inside a function is still a dependency). Read from the
source, so a rule broken anywhere fails here."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gpusnap"
FLOOR = {"atomic", "console", "errors", "knobs", "lifeline", "moved", "onimport", "protocol", "rawmem", "sources", "traverse", "trust"}  # importable from anywhere
# layer -> the layers it may import (besides itself and the floor)
ALLOWED = {
    "__init__": {"capture"},  # gpusnap.snapshot() asks the capture side
    "__main__": {"cli"},
    "cli": {"launch", "store", "demo", "files"},
    "demo": set(),  # runs gpusnap as a user would: through the command line
    "launch": {"store", "files"},  # files: put back before the replay starts
    "boot": {"instrument", "capture", "restore", "frameworks", "device"},  # device: tracking at boot
    "frameworks": {"capture", "restore", "graph", "instrument", "files"},  # adapters for both halves
    "capture": {"stage", "store", "instrument", "graph", "files"},
    "restore": {"store", "instrument", "graph", "files"},
    "files": {"store"},  # the program's files: recorded, kept in the store, put back
    "graph": {"instrument"},
    "stage": {"device"},
    "device": set(),  # the GPU backends: below the pipeline, beside store
    "store": set(),
    "instrument": set(),
}


def _layer(module: str) -> str:
    """``gpusnap.capture.trainee.agent`` -> ``capture``; the package itself is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported(module: str, is_package: bool, source: str):
    """(absolute gpusnap module, line) for each module that ``source``, the text of ``module``,
    imports. ``from A import b`` imports ``A.b`` where that is a module of the package, else
    ``A`` (b is a name in it)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            names = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                bases = [".".join(anchor + ([node.module] if node.module else []))]
            else:
                bases = [node.module]
            names = [alias.name for alias in node.names]
        else:
            continue
        for base in bases:
            if base != "gpusnap" and not base.startswith("gpusnap."):
                continue
            if not names:
                yield base, node.lineno
            for name in names:
                candidate = f"{base}.{name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or (
                    PACKAGE.parent / candidate.replace(".", "/") / "__init__.py").exists()
                yield candidate if is_module else base, node.lineno


def broken_rules(module: str, is_package: bool, source: str) -> list[str]:
    here = _layer(module)
    if here not in ALLOWED and here not in FLOOR:
        pytest.fail(f"gpusnap.{here} is a layer docs/architecture.md's dependency rules do not place: add it to ALLOWED")
    broken = []
    for target, line in imported(module, is_package, source):
        there = _layer(target)
        # The package itself (``from gpusnap import __version__``) is imported before any of
        # its modules anyway.
        if here == there or there in FLOOR or there == "__init__":
            continue
        if here in FLOOR or there not in ALLOWED[here]:
            broken.append(f"{module}:{line} imports {target}")
    return broken


def test_imports_run_down_the_pipeline():
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        broken += broken_rules(module, path.name == "__init__.py", path.read_text())
    assert not broken, "imports against docs/architecture.md's dependency rules:\n" + "\n".join(broken)


@pytest.mark.parametrize("source", [
    "import gpusnap.restore",
    "import gpusnap.restore.merge as m",
    "from gpusnap import restore",
    "from gpusnap.restore import merge",
    "from gpusnap.restore.merge import merge",
    "from ..restore import merge",
    "from .. import restore",
    "def later():\n    from gpusnap.restore import replay\n",
])
def test_every_import_form_is_caught(source):
    """store may import nothing of the pipeline: each form of ``store.rundir`` importing
    restore is a broken rule."""
    assert broken_rules("gpusnap.store.rundir", False, source) != []


def test_a_floor_module_imports_only_the_floor():
    assert broken_rules("gpusnap.errors", False, "from gpusnap import knobs") == []
    assert broken_rules("gpusnap.errors", False, "from gpusnap.store import rundir") != []


def test_launch_never_imports_torch():
    """The supervisor starts in milliseconds and never holds CUDA: no torch, capture or restore."""
    for path in (PACKAGE / "launch").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path.name} imports torch"
