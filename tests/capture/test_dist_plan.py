"""The iteration the ranks of a distributed run agree on (capture/dist/plan.py), from their posts."""

from __future__ import annotations

from gpusnap.capture.dist.plan import left_before, margin, reached, target

OUTER = ["train.py", "main", "20:4"]
INNER = ["train.py", "main", "26:12"]


def post(steps: int, *path) -> dict:
    return {"steps": steps, "path": [list(entry) for entry in path]}


def test_the_target_is_margin_steps_past_the_furthest_rank():
    at = target([post(7, [*OUTER, 7]), post(9, [*OUTER, 9])], margin=2)
    assert at == {"steps": 11}
    assert reached(post(11, [*OUTER, 3]), at) and not reached(post(10, [*OUTER, 99]), at)


def test_without_steps_the_target_is_an_iteration_of_the_loop_every_rank_stands_in():
    at = target([post(0, [*OUTER, 4], [*INNER, 1]), post(0, [*OUTER, 5], [*INNER, 0])], margin=2)
    assert at == {"steps": 2, "loops": [OUTER, INNER], "index": [5, 2]}


def test_ranks_that_posted_from_different_loops_meet_at_a_boundary_of_the_loops_they_share():
    # Without a step loop any boundary is a safe point: one rank posted inside the inner loop of
    # iteration 9, the others at the end of iterations 10 and 11. Before, the target named no
    # loop at all, only optimizer steps, which a program without torch.optim never takes: no
    # rank ever reached it, and the snapshot never came.
    posts = [post(0, [*OUTER, 9], [*INNER, 1]), post(0, [*OUTER, 11]), post(0, [*OUTER, 10]), post(0, [*OUTER, 11])]
    at = target(posts, margin=2)
    assert at == {"steps": 2, "loops": [OUTER], "index": [13]}
    assert reached(post(0, [*OUTER, 13]), at)
    assert not reached(post(0, [*OUTER, 12]), at)
    assert not reached(post(0, [*OUTER, 13], [*INNER, 0]), at)  # only at that loop's own boundary


def test_without_steps_the_target_lies_as_far_ahead_as_the_fastest_rank_runs_that_loop_in_the_lead_time():
    # A program without torch.optim posts no seconds per step: the target lay 2 iterations
    # ahead whatever its pace, and a rank whose thread learned it late on a loaded machine (50 ms
    # iterations) took its shard past it, one iteration after the others: no global snapshot.
    posts = [post(0, [*OUTER, 8], [*INNER, 1]), post(0, [*OUTER, 8])]
    posts[0]["paces"], posts[1]["paces"] = [0.05, 0.001], [0.04]
    assert target(posts, margin=2, lead_s=0.5) == {"steps": 2, "loops": [OUTER], "index": [8 + 13]}  # 0.5 s / 0.04 s
    assert target(posts, margin=2) == {"steps": 2, "loops": [OUTER], "index": [10]}
    posts[1]["paces"] = [None]  # no iteration done yet: the other rank's pace sets it
    assert target(posts, margin=2, lead_s=0.5)["index"] == [8 + 10]
    posts[0]["paces"] = [None, None]
    assert target(posts, margin=30, lead_s=0.5)["index"] == [38]  # no pace known: the margin


def test_an_inner_loop_shorter_than_the_target_leaves_it_to_the_loop_around_it():
    # allreduce.py all-reduces each gradient in `for p in (w, b)` inside the step loop: a SIGTERM
    # that found both ranks there targeted that loop 2 iterations past them, which its 2
    # iterations never reach; each rank left it first, and the stop snapshot failed (CI).
    posts = [post(0, [*OUTER, 20], [*INNER, 1]), post(0, [*OUTER, 20], [*INNER, 2])]
    assert target(posts, margin=2) == {"steps": 2, "loops": [OUTER, INNER], "index": [20, 4]}  # no length known yet
    for p in posts:
        p["lengths"] = [None, 2]
    at = target(posts, margin=2)
    assert at == {"steps": 2, "loops": [OUTER], "index": [22]}
    assert reached(post(0, [*OUTER, 22]), at) and not left_before(post(0, [*OUTER, 20], [*INNER, 2]), post(0, [*OUTER, 21]), at)
    posts[0]["lengths"] = posts[1]["lengths"] = [None, 8]  # long enough: the inner loop stays the target
    assert target(posts, margin=2)["loops"] == [OUTER, INNER]


def test_ranks_that_share_no_loop_meet_by_steps_alone():
    at = target([post(0, ["a.py", "f", "1:0", 3]), post(0, ["b.py", "g", "2:0", 3])], margin=2)
    assert at == {"steps": 2}


def test_a_rank_that_leaves_the_agreed_loop_before_its_iteration_has_passed_it():
    # Targets in the setup loop (OUTER) before anyone stepped: a rank that learns it only after
    # leaving that loop for the step loop would reach it by steps, somewhere else entirely.
    at = target([post(0, [*OUTER, 4]), post(0, [*OUTER, 5])], margin=2)
    step_loop = post(1, ["train.py", "main", "40:9", 0])
    assert left_before(post(0, [*OUTER, 6]), step_loop, at)
    assert not left_before(post(0, [*OUTER, 7]), step_loop, at)  # it reached the target there
    assert not left_before(post(0, [*OUTER, 5]), post(0, [*OUTER, 6]), at)  # still inside
    assert not left_before(None, step_loop, at) and not left_before(post(0, [*OUTER, 6]), step_loop, {"steps": 3})


# -- what a rank reads from the store, checked (capture/dist/check.py) ---------------------------

from gpusnap.capture.dist import check as distcheck  # noqa: E402

PLAN = {"id": "000007", "at": {"steps": 12}, "stop": False, "reason": "signal"}


def test_a_plan_must_name_a_snapshot_id_and_a_target():
    assert distcheck.plan(PLAN) is None
    for bad in ({**PLAN, "id": "../../../outside"}, {**PLAN, "id": "7"}, {**PLAN, "at": {"steps": -1}},
                {**PLAN, "stop": "yes"}, {**PLAN, "reason": "because"}, [PLAN], None):
        assert distcheck.plan(bad) is not None, bad


def test_a_shard_reported_committed_must_be_the_plans_and_on_disk_at_its_iteration():
    on_disk = {"000007": {"iteration": 40}, "000001": {"iteration": 4}}
    manifest = on_disk.get
    assert distcheck.done({"event": "committed", "id": "000007", "iteration": 40}, PLAN, manifest) is None
    assert distcheck.done({"event": "failed", "message": "no room"}, PLAN, manifest) is None
    assert "not of the agreed" in distcheck.done({"event": "committed", "id": "000001", "iteration": 4}, PLAN, manifest)
    assert "whose manifest says 40" in distcheck.done({"event": "committed", "id": "000007", "iteration": 99}, PLAN, manifest)
    assert "and it is not" in distcheck.done({"event": "committed", "id": "000007", "iteration": 40}, PLAN, lambda _: None)


def test_a_global_outcome_must_be_on_disk_and_what_a_rank_takes_of_it_is_the_report():
    top = {"000007": {"shards": {"0": {"snapshot": "000007"}, "1": {"snapshot": "000007"}}}}.get
    said = {"event": "committed", "id": "000007", "stop": True, "iteration": 40, "write_s": "slow"}
    assert distcheck.outcome(said, PLAN, top, 1) is None
    assert distcheck.outcome(said, PLAN, lambda _: None, 1) is not None
    assert distcheck.outcome_fields(said) == {"event": "committed", "id": "000007", "iteration": 40}


def test_values_too_large_or_too_deep_are_no_values_and_keys_carry_the_runs_nonce():
    for raw in (b"[" * (distcheck.MAX_VALUE_BYTES + 1), b"[" * 100_000, b"{not json"):
        try:
            distcheck.parse(raw)
        except ValueError:
            continue
        raise AssertionError(f"{raw[:10]!r}... parsed")
    one, other = distcheck.key_prefix("a" * 32, "job-1", "0"), distcheck.key_prefix("b" * 32, "job-1", "0")
    assert one != other and one.startswith("gpusnap/") and one.endswith("/0/")


def test_the_target_lies_a_lead_time_of_the_fastest_ranks_steps_ahead():
    fast, slow = {"steps": 9, "path": [], "step_s": 0.05}, {"steps": 8, "path": [], "step_s": 0.2}
    assert margin([fast, slow], least=2, lead_s=1.0) == 20  # a second of the fastest rank's steps
    assert margin([slow], least=2, lead_s=1.0) == 5
    assert margin([{"steps": 9, "path": [], "step_s": 2.0}], least=2, lead_s=1.0) == 2  # slow steps: the least
    assert margin([{"steps": 9, "path": [], "step_s": None}, {"steps": 9, "path": []}], least=2, lead_s=1.0) == 2
    assert margin([fast], least=2, lead_s=0) == 2
    assert target([fast, slow], margin([fast, slow], 2, 1.0)) == {"steps": 29}


def test_a_position_must_be_one():
    pos = {"steps": 0, "path": [[*OUTER, 3]], "stop": False, "reason": "signal", "next": "000002", "step_s": None, "paces": [0.05]}
    assert distcheck.post(pos) is None
    assert distcheck.post({k: v for k, v in pos.items() if k != "paces"}) is None  # a rank of an earlier gpusnap
    for bad in ({**pos, "paces": [0.05, 0.1]}, {**pos, "paces": [-1]}, {**pos, "paces": [True]}, {**pos, "paces": "fast"},
                {**pos, "step_s": -0.5}, {**pos, "path": [[*OUTER, -1]]}, {**pos, "next": "../x"}, {**pos, "reason": "why"}):
        assert distcheck.post(bad) is not None, bad
