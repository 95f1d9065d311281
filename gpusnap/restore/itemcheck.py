"""What a snapshot keeps of each loop for fast-forward, and the check replay makes with it.

Writer side, ``record(loop, read)`` gives a loop's manifest fields:

- ``resume``: its note (``fastforward.describe``), JSON;
- ``rng_at``: the global RNG states at the start of its current iteration (loops that enclose
  a step loop: ``loops.EnclosingLoop``);
- ``check``: ``{"index": n, "items": [{"at": [..], "digest": hex | null, "why": ...}]}``: for
  each part of the source that fast-forward will consume (``consumed_paths``), the digest of that
  part of the last item the loop handed to its body (item n - 1), read from the loop's
  ``_iterate`` generator.

Replay side, ``verify`` compares the items fast-forward reproduced with those digests. A part
without a digest is accepted only if consuming it left the global RNG states untouched.
"""

from __future__ import annotations

from gpusnap.graph import rng
from gpusnap.instrument import loops
from gpusnap.graph.digest import digest
from gpusnap.restore.fastforward import NO_ITEM

_MISSING = object()


# -- writer ------------------------------------------------------------------------------------
def note_json(note, read=None):
    """A note with its raw RNG states encoded (already-JSON notes pass through)."""
    if not isinstance(note, dict):
        return note
    out = {}
    for key, value in note.items():
        if key == "rng":
            value = rng.to_json(value, read)
        elif key == "generator_rng" and value is not None and not isinstance(value, str):
            value = rng.to_json((b"", None, None, value, None), read)["torch"]
        elif key == "args":
            value = [note_json(arg, read) for arg in value]
        elif key == "owned":
            value = {name: rng.owned_json(raw, read) for name, raw in value.items()}
        elif key == "inner":
            value = note_json(value, read)
        out[key] = value
    return out


def consumed_paths(note, at: tuple = ()) -> list[tuple]:
    """Where, in a loop's item, the parts that fast-forward consumes sit (tuple indexes)."""
    if not note:
        return []
    kind = note.get("kind")
    if kind == "iter" or (kind == "dataloader" and note.get("consumed")):
        return [at]
    if kind == "tqdm":
        return consumed_paths(note.get("inner"), at)
    if kind == "call":
        func, args = note.get("func"), note.get("args") or []
        if func == "zip":
            return [p for j, arg in enumerate(args) for p in consumed_paths(arg, at + (j,))]
        if func == "enumerate" and args:
            return consumed_paths(args[0], at + (1,))
        if func == "islice" and args:
            return consumed_paths(args[0], at)
    return []


def part_of(item, at: tuple):
    for i in at:
        if not isinstance(item, (tuple, list)) or i >= len(item):
            return _MISSING
        item = item[i]
    return item


def record(loop, read=None) -> dict:
    out = {"resume": note_json(loop.resume, read)}
    rng_at = getattr(loop, "rng_at", None)
    if rng_at is not None:
        out["rng_at"] = rng.to_json(rng_at, read)
    paths = consumed_paths(loop.resume)
    if paths and loop.index > 0:
        ref = getattr(loop, "gen", None)
        gen = ref() if ref is not None else None
        frame = gen.gi_frame if gen is not None else None
        item = frame.f_locals.get(loops.LAST_ITEM, _MISSING) if frame is not None else _MISSING
        out["check"] = {"index": loop.index, "items": [_digest_entry(part_of(item, at), at, read) for at in paths]}
    return out


def _digest_entry(value, at: tuple, read) -> dict:
    if value is _MISSING:
        return {"at": list(at), "digest": None, "why": "the item was not found"}
    hexdigest, why = digest(value, read)
    return {"at": list(at), "digest": hexdigest, "why": why}


# -- replay ------------------------------------------------------------------------------------
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
