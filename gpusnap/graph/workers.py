"""Whether the program's DataLoader workers draw random numbers: one byte of anonymous shared
memory that the trainee maps at start and its forked workers inherit.

Fast-forward skips a DataLoader's batches by its index sampler, so no skipped sample is loaded.
With worker processes that is exact only if the workers draw nothing from their global random
generators (torch's, seeded per worker by the loader; ``random``; numpy's) while they fetch: a
skipped batch's draws are never made, and the workers' generators stand elsewhere for the
batches after it (a random flip drawn per sample in ``__getitem__``). The capture agent wraps
torch's dataset fetchers; in a worker each fetch compares the global RNG states before and
after it and ``mark``s a change here. The writer records ``seen()`` in the manifest
(``workers_draw``), and restore then takes a worker loader's skipped batches for real.
A random generator the dataset holds itself (one made in ``worker_init_fn``) is not seen.
"""

from __future__ import annotations

import mmap

_page = None


def install() -> None:
    """Map the shared byte (the trainee, before any worker forks)."""
    global _page
    if _page is None:
        _page = mmap.mmap(-1, 1)  # anonymous and MAP_SHARED: a forked worker writes the parent's byte


def mark() -> None:
    """Note that workers drew (a worker's fetch; restore, for a snapshot that says so)."""
    install()
    _page[0] = 1


def seen() -> bool | None:
    """Did a worker's fetch draw random numbers (None: not watched in this process)?"""
    return None if _page is None else bool(_page[0])
