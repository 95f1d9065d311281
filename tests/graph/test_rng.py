"""random.Random's state read in place (graph.rng's per-version adapter), checked against
getstate(), and refused where the interpreter's layout is not known."""

from __future__ import annotations

import random

import pytest

from gpusnap.graph import rng


@pytest.mark.parametrize("seed", [0, 1, 7, 12345, 2**32 - 1, 2**80 + 17])
def test_the_adapter_reads_what_getstate_says(seed):
    generator = random.Random(seed)
    read = rng.random_reader(generator)
    for draws in (0, 1, 623, 1, 5000):  # around and across the twists of the 624 words
        for _ in range(draws):
            generator.random()
        assert read() == rng._packed(generator.getstate())
    generator.seed(seed + 1)  # seeding again rewrites the words in place: the same view still reads them
    assert read() == rng._packed(generator.getstate())


def test_an_interpreter_whose_layout_is_not_known_is_refused_and_getstate_serves(monkeypatch):
    monkeypatch.setattr(rng, "_VERSION", (3, 99))
    with pytest.raises(rng.LayoutUnknown, match=r"no known layout of random.Random for CPython 3.99 \(known: 3.11, 3.12, 3.13\)"):
        rng.random_reader(random.Random(3))
    monkeypatch.setattr(rng, "_random_read", None)
    monkeypatch.setattr(rng, "random_refused", None)
    random.seed(5)
    assert rng._random_raw() == rng._packed(random.getstate())
    assert rng._random_read is False and "3.99" in rng.random_refused


def test_a_layout_that_fails_its_check_is_refused(monkeypatch):
    header, index_at, state_at = rng.RANDOM_LAYOUTS[rng._VERSION]
    monkeypatch.setitem(rng.RANDOM_LAYOUTS, rng._VERSION, (header, index_at + 4, state_at + 4))
    with pytest.raises(rng.LayoutUnknown, match="is not what its getstate"):
        rng.random_reader(random.Random(3))


def test_this_interpreter_reads_in_place():
    rng._random_raw()
    assert rng._random_read is not False, rng.random_refused
