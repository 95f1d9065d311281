"""What a snapshot keeps of the state on the classes and functions a program's module defines
(``graph.roots``): class attributes, function attributes and mutable default arguments (of
methods too), and no
definition (methods, properties, nested classes, enum members, an ABC's registry) and nothing
the module imported.
tests/e2e/test_e2e_corpus.py restarts a program that keeps its state so (class_state)."""

from gpusnap.graph import roots

SOURCE = '''
import abc
import collections
import enum
import functools
from collections import OrderedDict


class Net:
    steps = 3
    table = {"a": 1}
    __private_by_convention = 5

    def forward(self):
        return self.steps

    def smooth(self, x, seen=[]):
        seen.append(x)
        return sum(seen) / len(seen)

    @staticmethod
    def counted(x, calls={"n": 0}):
        return x

    @property
    def doubled(self):
        return 2 * self.steps

    @staticmethod
    def helper():
        return 1

    class Inner:
        pass


class Color(enum.Enum):
    RED = 1


class Callback(abc.ABC):
    fired = 0


def weigh(x, stats={}, scale=2.0):
    return x


weigh.calls = 4


def plain(x, y=1, z=(1, "a"), *, name="n"):
    return x


def keyed(x, *, seen=[]):
    return x


@functools.lru_cache
def cached(x):
    return x
'''


def test_the_state_on_a_modules_classes_and_functions_is_kept_and_their_definitions_are_not(monkeypatch):
    import enum

    namespace = {"__name__": "prog"}
    exec(SOURCE, namespace)
    # a library marks a function of its own that classes of the program hold (torch.jit marks
    # Enum.__new__ so): not the program's state
    assert vars(namespace["Color"])["__new__"] is enum.Enum.__new__
    monkeypatch.setattr(enum.Enum.__new__, "library_mark", "not the program's", raising=False)
    found = roots._statics("prog", namespace)
    assert found == {
        "Net": {"steps": 3, "table": {"a": 1}, "_Net__private_by_convention": 5},
        "Net.smooth": {"__defaults__": ([],)},
        "Net.counted": {"__defaults__": ({"n": 0},)},
        "Callback": {"fired": 0},
        "weigh": {"calls": 4, "__defaults__": ({}, 2.0)},
        "keyed": {"__kwdefaults__": {"seen": []}},
    }
    assert found["weigh"]["__defaults__"][0] is namespace["weigh"].__defaults__[0]  # the live dict, merged in place
    assert roots.owner_at(namespace, "Net.smooth") is namespace["Net"].smooth
    assert roots.owner_at(namespace, "Net.counted") is namespace["Net"].counted
    assert roots.owner_at(namespace, "weigh.calls") is None  # only a class's methods are named so


def test_a_snapshots_named_roots_give_that_state_a_path():
    payload = {"frames": [], "globals": {}, "statics": {"prog": {"Net": {"steps": 3}}}}
    assert roots.named_roots(payload) == [("statics[prog].Net.steps", 3)]


def test_a_closure_the_programs_code_made_is_kept_with_the_globals_and_a_librarys_is_not():
    namespace = {"__name__": "prog"}
    exec(compile("def make_counter():\n    n = 0\n    def tick():\n        nonlocal n\n        n += 1\n        return n\n"
                 "    return tick\ntick = make_counter()\n", "/program/train.py", "exec"), namespace)
    import torch

    wrapped = torch.no_grad()(namespace["make_counter"])  # a closure whose code is torch's
    own = {"/program/train.py": "digest"}
    assert roots._keep_global("tick", namespace["tick"], own)
    assert not roots._keep_global("make_counter", namespace["make_counter"], own)  # a definition, by name
    assert not roots._keep_global("wrapped", wrapped, own)
    assert not roots._keep_global("tick", namespace["tick"], {})  # another file's closure
