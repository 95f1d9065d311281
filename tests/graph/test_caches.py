"""The program's functools caches (``graph.caches``): a ``ProgramCache`` answers every call as
CPython's wrapper does, only the program's own functions get one, and a snapshot keeps its entries
with the module's other state (``roots``), merged back into the replay's cache. The end-to-end
case, a getter's counter that once restarted "verified" with other final state:
tests/programs/corpus/cached_getters.py in tests/e2e/test_e2e_corpus.py."""

from __future__ import annotations

import collections
import functools
import pickle
import random
import sys
import types

import pytest

from gpusnap.graph import caches, roots
from gpusnap.instrument import importer
from gpusnap.restore.merge import Merger
from gpusnap.restore.replay import _attributes

PROGRAM = "/program/train.py"

SOURCE = '''
import collections
import functools
from functools import cache, lru_cache

calls = []


@lru_cache(maxsize=3)
def bounded(x, y=0):
    calls.append((x, y))
    return [x, y]


@cache
def stats():
    return collections.Counter()


@functools.lru_cache
def bare(x):
    return x * 2


@functools.lru_cache(maxsize=None, typed=True)
def typed(x):
    return (type(x).__name__, x)


class Net:
    @functools.cache
    def width(self, n):
        return [n]

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def table(n):
        return list(range(n))
'''


def load_program(monkeypatch, filename: str = PROGRAM, name: str = "prog") -> dict:
    """``SOURCE`` run as a module of the program's (its file in ``importer.SOURCES``) or, with
    another file, of a library's, with the trainee's decorators installed."""
    monkeypatch.setitem(importer.SOURCES, PROGRAM, "digest")
    monkeypatch.setattr(functools, "lru_cache", functools.lru_cache)
    monkeypatch.setattr(functools, "cache", functools.cache)
    caches.install()
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(SOURCE, filename, "exec"), module.__dict__)
    return module.__dict__


@pytest.mark.parametrize("maxsize,typed", [(None, False), (0, False), (1, False), (3, True), (128, False)])
def test_a_program_cache_answers_every_call_as_functools_does(maxsize, typed):
    seed = random.randrange(10**6)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    made = {"theirs": [], "ours": []}

    def record(into):
        def f(*args, **kwds):
            into.append((args, tuple(sorted(kwds.items()))))
            return object()  # a new object per real call: a cache hit gives the same one back
        return f

    theirs = caches._C_LRU_CACHE(maxsize=maxsize, typed=typed)(record(made["theirs"]))
    ours = caches.ProgramCache(record(made["ours"]), maxsize, typed)
    for _ in range(300):
        args = tuple(rnd.choice([1, 1.0, 2, "a", (1, 2), True]) for _ in range(rnd.randint(0, 2)))
        kwds = {k: rnd.choice([1, 2.0]) for k in rnd.sample(["k", "j"], rnd.randint(0, 2))}
        if rnd.random() < 0.02:
            theirs.cache_clear()
            ours.cache_clear()
        theirs(*args, **kwds)
        ours(*args, **kwds)
        assert ours.cache_info() == theirs.cache_info(), (args, kwds)
        assert made["ours"] == made["theirs"]
    assert ours.cache_parameters() == theirs.cache_parameters()


def test_only_the_programs_own_functions_get_a_program_cache(monkeypatch):
    ns = load_program(monkeypatch)
    for name in ("bounded", "stats", "bare", "typed"):
        assert isinstance(ns[name], caches.ProgramCache), name
    assert isinstance(vars(ns["Net"])["width"], caches.ProgramCache)
    assert ns["bounded"](1) == [1, 0] and ns["bounded"](1) is ns["bounded"](1) and ns["calls"] == [(1, 0)]
    assert ns["bounded"].__name__ == "bounded" and ns["bounded"].__wrapped__.__name__ == "bounded"
    net = ns["Net"]()
    assert net.width(4) is net.width(4) and ns["Net"].table(3) == [0, 1, 2]
    assert ns["typed"](1) != ns["typed"](1.0)
    # pickled by name, as CPython's wrapper is: the same object back
    assert pickle.loads(pickle.dumps(ns["stats"])) is ns["stats"]
    assert pickle.loads(pickle.dumps(vars(ns["Net"])["width"])) is vars(ns["Net"])["width"]

    library = load_program(monkeypatch, "/site-packages/lib/mod.py", "lib")
    for name in ("bounded", "stats", "bare", "typed"):
        assert type(library[name]) is type(caches._C_LRU_CACHE(None)(len)), name


def test_a_snapshot_keeps_a_caches_entries_and_the_merge_gives_them_back_shared_as_they_were(monkeypatch):
    run = load_program(monkeypatch)
    counts = run["stats"]()
    counts["seen"] += 96
    run["bounded"](1)
    run["bounded"](2, y=5)
    run["Net"].table(2)
    found = roots._statics("prog", run)
    assert found["stats"] == {"maxsize": None, "typed": False, "entries": {(): {"seen": 96}}, "hits": 0, "misses": 1}
    assert found["stats"]["entries"][()] is counts  # the live object: shared with the program's locals
    assert list(found["bounded"]["entries"].values()) == [[1, 0], [2, 5]]
    assert found["Net.table"]["entries"] == {2: [0, 1]}
    assert roots.owner_at(run, "Net.table") is vars(run["Net"])["table"].__func__

    # The replay's getter was called in setup (its own counter) or not at all; either way the
    # program's local and the cache end as one object with the run's counts.
    replay = load_program(monkeypatch)
    replayed = replay["stats"]()
    snap = pickle.loads(pickle.dumps({"statics": found, "local": counts}))
    merger = Merger(same_sources=True)
    live_cache = replay["stats"]
    merged = {name: merger.value(_attributes(live_cache).get(name), value, f"statics.stats.{name}")
              for name, value in snap["statics"]["stats"].items()}
    local = merger.value(replayed, snap["local"], "local")
    merger.finish()
    for name, value in merged.items():
        setattr(live_cache, name, merger.settled(value))
    local = merger.settled(local)
    assert replay["stats"]() is local and local == collections.Counter(seen=96)
    assert replay["stats"].cache_info().misses == 1
