"""The package's imports follow DESIGN.md's dependency rules: imports run down the pipeline,
never back. Every import statement counts, the ones inside functions too (a lazy import is
still a dependency). Read from the source, so a rule broken anywhere fails here."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gpusnap"
FLOOR = {"atomic", "console", "errors", "knobs", "lifeline", "protocol", "rawmem", "traverse", "trust"}  # importable from anywhere
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
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("gpusnap.") and target.split(".")[1] not in FLOOR:
                    yield module, target, node.lineno


def test_imports_run_down_the_pipeline():
    broken = []
    for module, target, line in _imports():
        here, there = _layer(module), _layer(target)
        if here == there or there in FLOOR:
            continue
        if here not in ALLOWED:
            pytest.fail(f"gpusnap.{here} is a layer DESIGN.md's dependency rules do not place: add it to ALLOWED")
        if there not in ALLOWED[here] and f"gpusnap.{there}" != target.rsplit(".", 1)[0] + "." + there:
            broken.append(f"{module}:{line} imports {target}")
    assert not broken, "imports against DESIGN.md's dependency rules:\n" + "\n".join(broken)


def test_launch_never_imports_torch():
    """The supervisor starts in milliseconds and never holds CUDA: no torch, capture or restore."""
    for path in (PACKAGE / "launch").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path.name} imports torch"
