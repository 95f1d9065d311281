"""What the supervisor says of the trainee's events: one line each (written on stderr through
``gpusnap.console``); on a terminal, a long write's progress on the status line."""

from __future__ import annotations

import json


def format_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 10 else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def describe(ev: dict, iteration=None) -> str | None:
    """One line for a trainee event, without the ``gpusnap: `` prefix; None when the trainee
    has said it on its own stderr already."""
    name = ev.get("event")
    sid = ev.get("id")
    snap = f"snapshot {sid}" if sid is not None else "snapshot"
    if name == "honored":
        where = f" ({ev['where']})" if ev.get("where") else ""
        reason = f" ({ev['reason']})" if ev.get("reason") else ""
        return f"snapshot{reason} at iteration {ev.get('iteration', '?')}{where}: safe point reached"
    if name == "coalesced":
        return "snapshot request coalesced: a snapshot is being written; the request is served after it"
    if name == "skipped":
        return f"snapshot skipped: {ev.get('message', 'no reason given')}"
    if name == "forked":
        return f"{snap} forked: stall {float(ev.get('stall_s', 0)):.3f} s"
    if name == "committed":
        it = ev.get("iteration", iteration)
        at = f" at iteration {it}" if it is not None else ""
        pruned = ev.get("pruned_first")
        room = f" (the disk was full: removed snapshot {', '.join(pruned)} first)" if pruned else ""
        return (
            f"{snap} committed{at}: stall {float(ev.get('stall_s', 0)):.3f} s, wrote "
            f"{format_bytes(ev.get('bytes_written'))} of {format_bytes(ev.get('bytes_total'))} "
            f"in {float(ev.get('write_s', 0)):.1f} s{room}"
        )
    if name == "cost":
        how = (f"over {ev.get('iterations')} iterations against {float(ev.get('step_s') or 0):.3f} s each, "
               f"+-{float(ev.get('noise_s') or 0):.2f} s" if ev.get("how") == "iterations"
               else "stall plus the writer's CPU time: no iteration times to measure it by")
        return f"{snap} cost training {float(ev.get('cost_s') or 0):.3f} s ({how})"
    if name == "steps":
        return f"training: an iteration takes {float(ev.get('step_s') or 0):.3f} s"
    if name in ("restored", "verified", "diverged"):
        return None  # the trainee printed its restore progress line by line
    if name == "failed":
        return f"{snap} failed: {ev.get('message', 'no reason given')}"
    if name == "dropped":
        return f"{ev.get('count', '?')} events of the program were dropped: the supervisor did not read them in time"
    rest = {k: v for k, v in ev.items() if k not in ("op", "event", "t")}
    return f"{name}: {json.dumps(rest)}"


def warning(ev: dict) -> tuple[str, str] | None:
    """(message, hint) of a warning that comes with an event (retention that failed after a
    commit), without the ``gpusnap: `` prefix; None when there is none."""
    if not ev.get("warning"):
        return None
    return f"warning: {ev['warning']}", str(ev.get("hint") or "see DIR/log.jsonl")


def percent(fraction) -> str:
    return "-" if fraction is None else f"{fraction * 100:.2f}%"


def schedule_line(info: dict, due: float | None, now: float) -> str | None:
    """One line for the schedule a snapshot's measured cost leads to (``launch.schedule``)."""
    spent = f"snapshots cost {info['cost_s']:.3f} s each, {percent(info['overhead'])} of training time so far"
    if info["every"] == "auto":
        if info["interval_s"] is None:
            return None
        when = "" if due is None else f"next in {max(0.0, due - now):.0f} s; "
        return (f"--every auto: a snapshot every {info['interval_s']:.0f} s keeps within {percent(info['budget'])} "
                f"({when}{spent})")
    return spent[0].upper() + spent[1:] if info["cost_s"] is not None else None


def progress_line(ev: dict, last_total=None) -> str:
    """A long write's progress (the writer's ``progress``), against the last snapshot's size."""
    done = float(ev.get("bytes_put") or 0)
    of = f" of ~{format_bytes(last_total)} ({min(done / last_total, 1.0):.0%})" if last_total else ""
    return (f"writing snapshot {ev.get('id', '?')}: {format_bytes(done)}{of} read, "
            f"{format_bytes(ev.get('bytes_written'))} written, {float(ev.get('s') or 0):.0f} s")
