"""``functools.lru_cache`` and ``functools.cache`` over the program's own functions, as a wrapper
whose entries a snapshot can hold.

A cached getter is how many programs keep one object for good: ``@functools.cache def stats():
return Counter()``, class weights made on first use and reweighted in place each epoch. The
object lives only in the cache, and CPython's wrapper keeps its cache where no Python code can
read it: a snapshot held nothing of it, the restart's getter made a fresh object, and a counter
that touched no parameter passed the witness ("verified", with other final state). So, in the
trainee, a cache decorator applied to a function of the program's own sources (``importer.
SOURCES``) makes a ``ProgramCache``: the same calls, keys, bounds and ``cache_info()``, with its
entries in a dict that ``roots`` keeps with the function's other state (``statics``) and restore
merges back. Libraries' caches keep CPython's wrapper: they hold no state of the program's, and
they are many (torch alone decorates hundreds of functions). A hit costs about 0.6 us, against
CPython's 0.09.
"""

from __future__ import annotations

import functools
import types

from gpusnap.graph.load import findable

_C_LRU_CACHE = functools.lru_cache
_FAST_TYPES = (int, str)


class _Kwargs:
    """Separates positional arguments from keyword ones in a key; a class, so that a key holding
    it pickles by name and means the same after a restart."""


def _key(args: tuple, kwds: dict, typed: bool):
    """functools' key of a call, as plain tuples (its own carries a hash computed in the run)."""
    key = args
    if kwds:
        key += (_Kwargs,)
        for item in kwds.items():
            key += item
    if typed:
        key += tuple(type(v) for v in args)
        if kwds:
            key += tuple(type(v) for v in kwds.values())
    elif len(key) == 1 and type(key[0]) in _FAST_TYPES:
        return key[0]
    return key


class ProgramCache:
    """A cached function of the program's: ``functools``' semantics, its entries in ``entries``."""

    def __init__(self, func, maxsize: int | None, typed: bool):
        functools.update_wrapper(self, func)
        self.maxsize = max(maxsize, 0) if maxsize is not None else None
        self.typed = typed
        self.entries: dict = {}
        self.hits = self.misses = 0

    def __call__(self, *args, **kwds):
        if self.maxsize == 0:
            self.misses += 1
            return self.__wrapped__(*args, **kwds)
        key = _key(args, kwds, self.typed)
        entries = self.entries
        try:
            result = entries[key]
        except KeyError:
            pass
        else:
            self.hits += 1
            if self.maxsize is not None:
                entries[key] = entries.pop(key)  # the most recently used goes last
            return result
        self.misses += 1
        result = self.__wrapped__(*args, **kwds)
        if self.maxsize is not None:
            if key in entries:  # a recursive call stored it meanwhile: functools keeps that one
                return result
            if len(entries) >= self.maxsize:
                del entries[next(iter(entries))]  # the least recently used
        entries[key] = result
        return result

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def cache_info(self):
        return functools._CacheInfo(self.hits, self.misses, self.maxsize, len(self.entries))

    def cache_clear(self) -> None:
        self.entries.clear()
        self.hits = self.misses = 0

    def cache_parameters(self) -> dict:
        return {"maxsize": self.maxsize, "typed": self.typed}

    def __reduce__(self):
        if findable(self):
            return self.__qualname__  # by name, as CPython's wrapper pickles
        # A cached function made inside another (`main()`'s own getter): by value, as its
        # function pickles (gpusnap's pickler keeps a local function's code and cells; pickle's
        # own refuses it, as it refuses CPython's wrapper)
        return ProgramCache, (self.__wrapped__, self.maxsize, self.typed), vars(self)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return f"<functools._lru_cache_wrapper object of {self.__qualname__} (gpusnap)>"


def _is_programs(func) -> bool:
    from gpusnap.instrument.importer import SOURCES

    code = getattr(func, "__code__", None)
    return code is not None and code.co_filename in SOURCES


def lru_cache(maxsize=128, typed=False):
    """``functools.lru_cache``: a ``ProgramCache`` over the program's functions."""
    if callable(maxsize) and isinstance(typed, bool):  # @lru_cache, without arguments
        return lru_cache(128, typed)(maxsize)
    if maxsize is not None and not isinstance(maxsize, int):
        return _C_LRU_CACHE(maxsize, typed)  # functools' own TypeError

    def decorating_function(func):
        return ProgramCache(func, maxsize, typed) if _is_programs(func) else _C_LRU_CACHE(maxsize, typed)(func)

    return decorating_function


def cache(func):
    """``functools.cache``, as functools defines it."""
    return lru_cache(maxsize=None)(func)


def install() -> None:
    """In the trainee, before the program's first line: decorators the program applies from here
    on (``functools.lru_cache``, ``from functools import cache``) are these."""
    functools.lru_cache = lru_cache
    functools.cache = cache

