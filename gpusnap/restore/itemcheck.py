"""The check replay makes of the items fast-forward reproduced.

The writer (``capture.loopnotes.record``) keeps, for each loop, these manifest fields:

- ``resume``: its note (``fastforward.describe``), JSON;
- ``rng_at``: the global RNG states at the start of its current iteration (loops that enclose
  a step loop: ``loops.EnclosingLoop``);
- ``check``: ``{"index": n, "items": [{"at": [..], "digest": hex | null, "why": ...}]}``: for
  each part of the source that fast-forward will consume (``consumed_paths``), the digest of that
  part of the last item the loop handed to its body (item n - 1), read from the loop's
  ``_iterate`` generator.

Here ``verify`` compares the items fast-forward reproduced with those digests. A part
without a digest is accepted only if consuming it left the global RNG states untouched.
"""

from __future__ import annotations

from gpusnap.graph.digest import MISSING as _MISSING, digest, part_of
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
