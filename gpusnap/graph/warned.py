"""The warnings the program was shown once, kept across a restart.

Python shows a warning once per place by default: each module's ``__warningregistry__`` (and
``warnings.onceregistry``, for the "once" action) records what it has shown, and a record holds
while the filters' version it carries is the process's. A restarted process had shown none, and
each warning the run had shown before the snapshot came again: into the log, where
``logging.captureWarnings`` sends warnings, lines the uninterrupted run never wrote
(``tests/programs/corpus/warn_once.py``: "verified", 2 of 2). The records that hold at the safe
point are kept (``capture``, in the settings' payload) and put back after the merge, holding in
the restarted process (``restore``); every other record is cleared, as the run's would have been
at its module's next warning.

The filters' version is read without changing it: ``filterwarnings`` and ``catch_warnings`` bump
it, and a bump lets every once-per-place warning show again.
"""

from __future__ import annotations

import contextlib
import re
import sys
import types
import warnings


class _VersionProbe(Warning):
    """Warned only to read the filters' version, and ignored by a filter put in place for it."""


@contextlib.contextmanager
def ignored(category: type, message: str | None = None):
    """Warnings of ``category`` (whose text matches ``message``) ignored, by a filter put into
    ``warnings.filters`` in place and taken out after: ``filterwarnings`` and ``catch_warnings``
    would bump the filters' version, and every warning shown once per place would show again."""
    entry = ("ignore", re.compile(message, re.I) if message else None, category, None, 0)
    warnings.filters.insert(0, entry)
    try:
        yield
    finally:
        at = next((i for i, kept in enumerate(warnings.filters) if kept is entry), None)
        if at is not None:
            del warnings.filters[at]


def filters_version() -> int | None:
    """The version of the process's warning filters, as a registry records it; None where it
    cannot be read."""
    registry: dict = {}
    try:
        with ignored(_VersionProbe):
            warnings.warn_explicit("", _VersionProbe, "gpusnap", 0, registry=registry)
    except Exception:  # noqa: BLE001 - a warnings module not as CPython's
        return None
    version = registry.get("version")
    return version if isinstance(version, int) else None


def _named(category) -> str | None:
    module, name = getattr(category, "__module__", None), getattr(category, "__qualname__", "")
    return f"{module}:{name}" if module and "<locals>" not in name else None


def _category(named: str):
    module, _, name = named.partition(":")
    found = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) and issubclass(found, Warning) else None


def _records(registry, version: int) -> list:
    """A registry's keys, each (text, category named, *rest), where it holds at ``version``."""
    if not isinstance(registry, dict) or registry.get("version") != version:
        return []
    kept = []
    for key, shown in registry.items():
        if shown and isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str):
            named = _named(key[1])
            if named is not None:
                kept.append((key[0], named, *key[2:]))
    return kept


def capture() -> dict | None:
    """The records that hold now: {"modules": {module name: records}, "once": records}."""
    version = filters_version()
    if version is None:
        return None
    modules = {}
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType):
            records = _records(module.__dict__.get("__warningregistry__"), version)
            if records:
                modules[name] = records
    return {"modules": modules, "once": _records(warnings.onceregistry, version)}


def restore(saved: dict | None) -> None:
    """Put the run's records back, holding at this process's version; clear the others."""
    version = filters_version()
    if saved is None or version is None:
        return
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType) and isinstance(registry := module.__dict__.get("__warningregistry__"), dict):
            registry.clear()
    for name, records in saved.get("modules", {}).items():
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            _put(module.__dict__.setdefault("__warningregistry__", {}), records, version)
    warnings.onceregistry.clear()
    _put(warnings.onceregistry, saved.get("once", []), version)


def _put(registry: dict, records: list, version: int) -> None:
    registry.clear()
    for text, named, *rest in records:
        category = _category(named)
        if category is not None:
            registry[(text, category, *rest)] = True
    registry["version"] = version
