"""Training phases that ran their course: the loops a snapshot names so that its replay runs
them zero times (a teacher's training before the student's, a learning-rate range test before
the real loop), in process, on instrumented code whose "optimizer step" is the agent's hook."""

from __future__ import annotations

import textwrap

import pytest

from gpusnap.capture.safepoints import steploop
from gpusnap.capture.trainee import costs
from gpusnap.instrument import importer, loops, transform


@pytest.fixture(autouse=True)
def agent(monkeypatch):
    """The capture agent's loop hooks, with fresh state: no step loop known, nothing finished."""
    for name, value in (("_step_loops", {}), ("_finished", []), ("_stepper_checked", True), ("_in_child", False)):
        monkeypatch.setattr(steploop, name, value)
    monkeypatch.setattr(costs, "iteration", lambda: None)
    for name, value in (("pending", False), ("on_boundary", None), ("on_loop_start", None), ("describe_source", None),
                        ("capture_rng", None), ("replaying", None), ("on_loop_end", steploop.loop_ended)):
        monkeypatch.setattr(loops, name, value)
    loops.ACTIVE.clear()
    yield
    loops.ACTIVE.clear()


def run(source: str, **names) -> dict:
    """Run a dedented snippet, instrumented; ``step()`` in it is an optimizer step, ``seen()``
    records the finished loops there, as a snapshot would at that moment."""
    namespace = {"__name__": "snippet", "step": lambda: steploop._before_optimizer_step(None), "seen": [], **names}
    namespace["look"] = lambda: namespace["seen"].append([(e["function"], e["loop_id"], e["ran"]) for e in steploop.finished_loops()])
    importer.bind_runtime(namespace)
    exec(transform.compile_instrumented(textwrap.dedent(source), "<phases>"), namespace)
    return namespace


def test_a_phase_that_stepped_and_ended_is_named_until_the_program_ends():
    found = run("""
        def teach(n):
            for i in range(n):
                step()

        def probe(n):
            for i in range(n):  # no step: evaluation runs again on replay
                pass

        def learn(n):
            for i in range(n):
                step()
                look()

        teach(4)
        probe(3)
        learn(2)
    """)
    assert found["seen"] == [[("teach", "3:4", 4)]] * 2


def test_a_loop_that_ended_in_an_earlier_iteration_of_a_running_loop_is_passed_over_with_it():
    found = run("""
        def fit(epochs):
            for epoch in range(epochs):
                for batch in range(3):
                    step()
                for batch in range(2):  # evaluation, where a snapshot may land between epochs
                    look()

        fit(2)
    """)
    # Each epoch names its own training loop only: the earlier epoch's goes with the index.
    assert found["seen"] == [[("fit", "4:8", 3)]] * 4


def test_loops_the_step_ran_outside_of_and_generators_loops_are_not_phases():
    found = run("""
        def batches():
            for i in range(3):  # suspended while the step runs: not a training loop
                yield i

        def warm_up():
            for i in range(2):
                pass
            for i in batches():
                step()

        warm_up()
        for i in range(2):
            step()
            look()
    """)
    assert found["seen"] == [[("warm_up", "9:4", 3)]] * 2


def test_a_loop_the_replay_passes_over_runs_no_iteration_and_its_else_runs():
    def skip_second(loop, iterable):
        return loops.SKIP if loop.loop_id in ("4:0", "6:0") else None

    loops.on_loop_start = skip_second
    found = run("""
        for i in range(2):
            out.append(("for", i))
        for i in range(5):
            out.append(("skipped for", i))
        while len(out) < 4:
            out.append("skipped while")
        else:
            out.append("else")
        n = 0
        while n < 2:
            n += 1
            out.append(("while", n))
    """, out=[])
    assert found["out"] == [("for", 0), ("for", 1), "else", ("while", 1), ("while", 2)]
    assert loops.ACTIVE == []
