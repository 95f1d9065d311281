"""How the supervisor shows the trainee's events: one line each, on stderr."""

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
        return (
            f"{snap} committed{at}: stall {float(ev.get('stall_s', 0)):.3f} s, wrote "
            f"{format_bytes(ev.get('bytes_written'))} of {format_bytes(ev.get('bytes_total'))} "
            f"in {float(ev.get('write_s', 0)):.1f} s"
        )
    if name == "restored":
        return None  # the trainee printed its restore progress line by line
    if name == "failed":
        return f"{snap} failed: {ev.get('message', 'no reason given')}"
    rest = {k: v for k, v in ev.items() if k not in ("op", "event", "t")}
    return f"{name}: {json.dumps(rest)}"


def warning(ev: dict) -> tuple[str, str] | None:
    """(message, hint) of a warning that comes with an event (retention that failed after a
    commit), without the ``gpusnap: `` prefix; None when there is none."""
    if not ev.get("warning"):
        return None
    return f"warning: {ev['warning']}", str(ev.get("hint") or "see DIR/log.jsonl")
