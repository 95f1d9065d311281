"""Where the ranks of a torchrun job take a global snapshot, from where each stood when asked:
pure functions of the positions the ranks posted (``coordinator.position``), with no store, no
thread and no process of their own, so that they are tested alone (tests/capture/test_dist_plan.py).

A position is ``{"steps": optimizer steps, "path": [[file, qualname, loop id, index], ...],
"step_s": seconds per iteration or None, "paces": [seconds per iteration of each loop on the
path so far, or None], "lengths": [iterations of each loop's last complete run, or None]}``, the
loops on the rank's path from the outermost in;
a target is ``{"steps": N}``, with ``"loops"`` and ``"index"`` before any rank has stepped."""

from __future__ import annotations

import math

_MOST = 100_000  # the most steps a target lies ahead, for a program that posts absurdly fast iterations


def margin(posts: list[dict], least: int, lead_s: float) -> int:
    """How far past the furthest rank the target lies: ``least`` steps, or as many as the
    fastest rank takes in ``lead_s`` (by the seconds per iteration it posted), whichever is
    more. Each rank learns the target from a thread that talks to the job's store; fast steps
    on a busy machine passed two steps before it did."""
    return _lead(least, lead_s, [p["step_s"] for p in posts if isinstance(p.get("step_s"), (int, float)) and p["step_s"] > 0])


def _lead(least: int, lead_s: float, paces: list) -> int:
    """``least``, or as many iterations as the fastest of ``paces`` (seconds each) runs in
    ``lead_s``, whichever is more (at most _MOST)."""
    if not paces or lead_s <= 0:
        return least
    return max(least, min(_MOST, math.ceil(lead_s / min(paces))))


def target(posts: list[dict], margin: int, lead_s: float = 0.0) -> dict:
    """The position every rank snapshots at: ``margin`` optimizer steps past the furthest rank.
    Before any rank has stepped (setup, or a program without torch.optim), also ``margin``
    iterations past the furthest rank of the innermost loop they all stand in, or as many as the
    fastest rank runs of that loop in ``lead_s`` (by the ``paces`` posted), whichever is more;
    the first of the two reached is the target. Ranks may post from different boundaries
    (without a step loop, any loop's boundary is a safe point: one rank stands in the inner loop
    of an iteration, another at the end of it): the target is then a boundary of the loops their
    paths share, which every rank reaches. An inner loop whose last complete run (``lengths``)
    ended before the target's index is left for the loop around it: `for p in (w, b)` inside the
    step loop runs 2 iterations, and a target 3 past the furthest rank's there was never
    reached; each rank left the loop first, and the stop snapshot failed."""
    at: dict = {"steps": max(p["steps"] for p in posts) + margin}
    if any(p["steps"] for p in posts):
        return at
    common = []
    for level in zip(*(p["path"] for p in posts)):
        if any(entry[:3] != level[0][:3] for entry in level):
            break
        common.append(list(level[0][:3]))
    while common:
        furthest = max(tuple(entry[3] for entry in p["path"][: len(common)]) for p in posts)
        level = len(common) - 1
        paces = [p["paces"][level] for p in posts if len(p.get("paces") or ()) > level and p["paces"][level]]
        index = furthest[-1] + _lead(margin, lead_s, paces)
        lengths = [p["lengths"][level] for p in posts if len(p.get("lengths") or ()) > level and p["lengths"][level] is not None]
        if level and lengths and index > min(lengths):
            common.pop()  # a short inner loop: its run ends before the target
            continue
        at.update(loops=common, index=[*furthest[:-1], index])
        break
    return at


def reached(pos: dict, at: dict) -> bool:
    if pos["steps"] >= at["steps"]:
        return True
    if at.get("loops") is None or [entry[:3] for entry in pos["path"]] != at["loops"]:
        return False
    return tuple(entry[3] for entry in pos["path"]) >= tuple(at["index"])


def left_before(previous: dict | None, pos: dict, at: dict) -> bool:
    """Did this rank leave the loops of the agreed iteration (``at``) without reaching it, since
    its last safe point? It would reach the target by steps alone, elsewhere in the program than
    the ranks that reached it in those loops: their shards would not be one snapshot."""
    loops = at.get("loops")
    if not loops or previous is None or reached(previous, at):
        return False

    def inside(p: dict) -> bool:
        return [entry[:3] for entry in p["path"][: len(loops)]] == loops

    return inside(previous) and not inside(pos)
