"""The check replay makes of the items fast-forward reproduced.

``verify`` compares them with the digests the writer kept of the original run's items (each
loop's ``check``: ``capture.trainee.loopnotes.record`` describes it). A part without a digest is
accepted only if consuming it left the global RNG states untouched.
"""

from __future__ import annotations

from gpusnap.graph.digest import MISSING as _MISSING
from gpusnap.graph.digest import digest, part_of
from gpusnap.restore.fastforward import NO_ITEM


def verify(consumed: list, check: dict | None, item=_MISSING) -> list[str]:
    """Problems with the items fast-forward reproduced, as phrases ("" when there is none).

    ``consumed``: ``fastforward.Consumed`` entries. ``item``: the loop's item as replay fetched
    it (an enclosing loop, whose recorded item is the one after the consumed ones); without it,
    each entry's last consumed item is compared (the innermost loop)."""
    recorded = {tuple(entry["at"]): entry for entry in (check or {}).get("items", [])}
    index = (check or {}).get("index")
    problems = []
    for entry in consumed:
        saved = recorded.get(tuple(entry.at))
        value = entry.last if item is _MISSING else part_of(item, entry.at)
        if saved is not None and saved.get("digest") and value is not _MISSING and value is not NO_ITEM:
            if digest(value)[0] != saved["digest"]:
                where = f" at iteration {index - 1}" if index else ""
                problems.append(f"reproduced a different item{where} than the run that took the snapshot")
            continue
        if entry.draws:
            why = (saved or {}).get("why") or "none was recorded"
            problems.append(
                f"cannot prove its position (no digest of its items: {why}) and consuming its source draws random numbers"
            )
    return problems
