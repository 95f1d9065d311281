"""The witness's records of the step loop's frame: for a program that steps no torch.optim
optimizer, the host tensors it holds, compared by name (graph/witness.py's ``locals``); for
every program, which of them share memory (``shared``)."""

from __future__ import annotations

import sys

import torch

from gpusnap.graph import witness


def _record(frame) -> dict:
    docs = []
    recorder = witness.Recorder("000001", docs.append, [["f", "g", "1:0"]], window=1)
    recorder.at_boundary(witness.NO_ITEM, 0, frame)
    return docs[-1]


def _check(doc: dict, frame) -> list[str]:
    failed = []
    checker = witness.Checker(doc, failed.append, lambda message: None, lambda *counts: None)
    checker.at_boundary(witness.NO_ITEM, 0, frame)
    return failed


def test_a_program_without_an_optimizer_is_judged_by_the_tensors_its_loop_holds():
    """A DP-SGD by hand restarted with its parameter dict's bytes overwritten said verified: its
    witness compared batches and random states only. Now a difference names the local."""
    def loop_frame(weights, step):
        torch.manual_seed(0)  # the random states after the iteration are compared too
        model = torch.nn.Linear(2, 1)  # noqa: F841 - what the frame holds
        with torch.no_grad():
            model.weight.fill_(0.5)
            model.bias.fill_(0.0)
        params = {"w": weights, "b": torch.zeros(1)}  # noqa: F841
        history = [0.5, 0.25]  # noqa: F841 - no tensors: no digest
        return sys._getframe()

    doc = _record(loop_frame(torch.arange(4.0), 3))
    assert doc["params"] is None and set(doc["locals"]["digests"]) == {"model", "params", "weights"}
    assert _check(doc, loop_frame(torch.arange(4.0), 3)) == []
    failed = _check(doc, loop_frame(torch.zeros(4), 3))
    assert len(failed) == 1 and "the tensors in params, weights differ" in failed[0], failed


def test_a_program_with_an_optimizer_keeps_its_params_record_alone():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    docs = []
    recorder = witness.Recorder("000001", docs.append, [["f", "g", "1:0"]], window=1)
    recorder.stepped(optimizer, 1)
    recorder.at_boundary(witness.NO_ITEM, 1, sys._getframe())
    assert docs[-1]["params"] is not None and "locals" not in docs[-1]


def _train_two_iterations(watch, decay_views_the_weight: bool) -> None:
    """Two iterations of a step followed by a decay written through a NumPy array, which views
    the weight (the run) or a copy of it (a restore that adopted the array apart from it)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    decay = model.weight.detach().numpy()
    if not decay_views_the_weight:
        decay = decay.copy()
    for iteration in (1, 2):
        loss = model(torch.ones(1, 3)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        watch.stepped(optimizer, iteration)
        decay *= 0.5
        watch.at_boundary(witness.NO_ITEM, iteration, sys._getframe())


def test_what_an_iteration_does_to_the_parameters_after_its_step_is_compared_at_the_window_s_end():
    """A decay through a NumPy view of a weight, after the optimizer step: a restore that held
    the view apart from the weight computed the same first step, and the witness, which digested
    the parameters there alone, said verified (late_hooks.py numpy, 1 of 3)."""
    docs = []
    _train_two_iterations(witness.Recorder("000001", docs.append, [["f", "g", "1:0"]], window=2), True)
    doc = docs[-1]
    assert doc["params"]["iteration"] == 1 and doc["params_last"]["iteration"] == 2

    def check(decay_views_the_weight: bool) -> list[str]:
        failed = []
        _train_two_iterations(witness.Checker(doc, failed.append, lambda message: None, lambda *counts: None),
                              decay_views_the_weight)
        return failed

    assert check(True) == []
    failed = check(False)
    assert failed == ["after the second iteration after the snapshot (the last the witness holds), the parameters differ "
                      "from the run that took it"]


def test_a_restart_whose_arithmetic_differs_says_the_parameters_were_not_compared(monkeypatch):
    """Where this process sums otherwise than the run (other intra-op threads, CPU kernels, torch),
    the parameters' bytes cannot be compared, and the witness skipped them, saying "verified" all
    the same: a restart that lost the run's `torch.set_num_threads` said so with other final
    state (global_modes.py threads). Verified now names what it did not compare, and why."""
    docs = []
    _train_two_iterations(witness.Recorder("000001", docs.append, [["f", "g", "1:0"]], window=2), True)
    here = witness.arithmetic()
    monkeypatch.setattr(witness, "arithmetic", lambda: {**here, "threads": here["threads"] + 1})
    failed, verified = [], []
    _train_two_iterations(witness.Checker(docs[-1], failed.append, lambda message: None,
                                          lambda *outcome: verified.append(outcome)), False)
    assert failed == [] and verified == [(2, 0, [f"the parameters: other arithmetic here (threads {here['threads'] + 1}, "
                                                 f"{here['threads']} in the run)"])]
    monkeypatch.setattr(witness, "arithmetic", lambda: here)
    verified.clear()
    _train_two_iterations(witness.Checker(docs[-1], failed.append, lambda message: None,
                                          lambda *outcome: verified.append(outcome)), True)
    assert failed == [] and verified == [(2, 0, [])]


def test_without_an_optimizer_the_last_digest_is_compared_at_the_same_record_of_the_window():
    """A program without an optimizer counts no iterations (each record's is 0): the frame's
    tensors at the window's last boundary were compared at its first, and valid restarts of
    word_lm.py and dp_sgd.py were refused. They are compared by record, the first, second, ..."""
    def run(watch, last_weight: float) -> None:
        torch.manual_seed(0)
        for k, value in enumerate((1.0, 2.0, last_weight)):
            weights = torch.full((3,), value)  # noqa: F841 - what the frame holds
            watch.at_boundary(witness.NO_ITEM, 0, sys._getframe())

    docs = []
    run(witness.Recorder("000001", docs.append, [["f", "g", "1:0"]], window=3), 3.0)
    assert docs[-1]["locals_last"]["record"] == 3 and docs[-1]["locals_last"]["iteration"] == 0

    def check(last_weight: float) -> list[str]:
        failed = []
        run(witness.Checker(docs[-1], failed.append, lambda message: None, lambda *counts: None), last_weight)
        return failed

    assert check(3.0) == []
    assert check(4.0) == ["after the third iteration after the snapshot (the last the witness holds), the tensors in "
                          "weights differ from the run that took it (no optimizer to compare)"]


def test_tensors_that_shared_memory_in_the_run_and_not_in_the_restart_are_a_difference():
    """`best_state = model.state_dict()` without a copy: the restart once held it apart from the
    parameters, computed the same first iterations, and ended with stale weights, verified."""
    def loop_frame(aliased):
        torch.manual_seed(0)  # the same weights and random states each time
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841 - what the frame holds
        best_state = model.state_dict() if aliased else {k: v.clone() for k, v in model.state_dict().items()}  # noqa: F841
        return sys._getframe()

    doc = _record(loop_frame(aliased=True))
    assert sorted(doc["shared"]["pairs"]) == [["model[bias]", "best_state[bias]"], ["model[weight]", "best_state[weight]"]]
    assert _check(doc, loop_frame(aliased=True)) == []
    failed = _check(doc, loop_frame(aliased=False))
    assert failed == ["after the first iteration after the snapshot, model[bias] and best_state[bias] shared memory in the "
                      "run that took it, and here they do not"]
    failed = _check(_record(loop_frame(aliased=False)), loop_frame(aliased=True))
    assert len(failed) == 1 and "share memory here, and in the run that took it they did not" in failed[0]


def test_one_optimizer_per_parameter_stepped_in_backward_is_no_runaway_but_a_loop_that_never_ends_one_is():
    """The optimizer step fused into backward (one Adam per parameter, stepped by a
    post-accumulate-grad hook) steps six optimizers an iteration: its restart was refused after
    17 steps, though every iteration ended and matched. Steps are counted per iteration now,
    and bounded by the optimizers that step."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    optimizers = [torch.optim.SGD([p], lr=0.1) for p in model.parameters()]
    docs = []
    recorder = witness.Recorder("000001", docs.append, [["f", "g", "1:0"]], window=3)
    for iteration in (1, 2, 3):
        recorder.at_boundary(iteration, iteration)
    failed, verified = [], []
    checker = witness.Checker(docs[-1], failed.append, lambda message: None, lambda *counts: verified.append(counts))
    for iteration in (1, 2, 3):
        for optimizer in optimizers:
            checker.stepped(optimizer, iteration)
        checker.at_boundary(iteration, iteration)
    assert failed == [] and verified == [(3, 0, [])]

    checker = witness.Checker(docs[-1], failed.append, lambda message: None, lambda *counts: None)
    for _ in range(witness.STEPS_PER_OPTIMIZER + 1):
        checker.stepped(optimizers[0], 1)
    assert len(failed) == 1 and "optimizer steps after the snapshot without ending an iteration" in failed[0], failed


def test_a_fault_of_the_witness_stops_it_and_never_reaches_the_program(monkeypatch, capsys):
    """The witness records inside the program's loop: an exception there once ended the program
    (`arithmetic()` without torch imported). Now the witness stops, saying so."""
    from gpusnap.capture.trainee import witness as witnessing
    from gpusnap.instrument import loops

    def broken(frame):
        raise RuntimeError("a record it could not take")

    monkeypatch.setattr(witness, "locals_digests", broken)  # the fault, injected
    loop = loops.ActiveLoop("1:0", sys._getframe(), "for")
    loop.index = 1
    recorder = witness.Recorder("000007", lambda doc: None, [witness.loop_key(loop)], window=2)
    monkeypatch.setattr(witness, "active", recorder)
    assert witnessing.at_boundary(loop) is False
    assert witness.active is None
    assert "gpusnap: warning: the witness of snapshot 000007 stops at what it recorded (RuntimeError" in capsys.readouterr().err


def test_an_item_at_the_address_of_a_batch_fetched_and_freed_earlier_is_still_digested():
    """Accelerate's loader yields a copy of each batch its DataLoader fetched (a new list). An
    iteration's record digests its item unless it is one of the batches fetched: that was asked by
    `id()`, and the epoch record spans an evaluation whose batches are freed by then, so the item
    could take a freed batch's address and go undigested in one process and not in the other. A
    restart was refused, now and then ("consumed another batch than in the run that took it")."""
    def record(reuse: bool) -> dict:
        recorder = witness.Recorder("000001", lambda doc: None, [["f", "g", "1:0"]], window=1)
        evaluated = [torch.ones(2)]
        recorder.fetched(evaluated)
        for later in ([torch.ones(3)], [torch.ones(4)]):  # the evaluation's next batches, the epoch's first
            recorder.fetched(later)
        freed, kept = id(evaluated), [evaluated]
        if reuse:
            del evaluated, kept[0]
        item = [torch.zeros(2)]
        while id(item) != freed and len(kept) < 10000:  # a list of the same size class takes a freed one's place
            kept.append(item)
            item = [torch.zeros(2)]
        assert (id(item) == freed) == reuse
        return recorder.record(item, 1)

    assert record(reuse=True)["batch"] == record(reuse=False)["batch"]
