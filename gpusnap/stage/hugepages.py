"""Huge pages under the tensors a snapshot drains: one write fault per 2 MiB instead of per 4 KiB.

Fork write-protects every page of the trainee. Once the writer has drained a tensor and dropped
its own mapping, the trainee's first write to each page is a fault that reuses the page in
place: cheap, but one per 4 KiB page. On the CI machine (a VM) that made the optimizer step
after a snapshot +0.11 s at 0.5 GB of model + Adam state and +0.22 to +0.39 s at 1.41 GB
(tools/results/bench_snapshot-cpu-2026-11-22-exp-hugepages.txt). A 2 MiB huge page is one
page-table entry: when the writer has dropped all of it, the trainee's first write makes the
whole 2 MiB writable again. Measured the same way: +0.01 to +0.03 s at both sizes (one run of
four at 1.41 GB: +0.3 s), and fork itself copies 512 times fewer entries.

So, between snapshots, the trainee asks the kernel to collapse the optimizers' large CPU tensors
into huge pages (madvise MADV_COLLAPSE, Linux 6.1 and later). Only whole huge pages inside a
storage are collapsed, so no neighbouring allocation changes backing. This is what khugepaged
does on its own under THP "always": bytes and addresses stay as they are, only the physical
pages change. It works whatever the THP sysfs mode (MADV_COLLAPSE ignores it) and leaves the
region's VMA flags alone, so the program's later allocations get the pages they always got.
Best effort: an older kernel (EINVAL), no free huge page (EAGAIN, ENOMEM) or pinned memory
leaves 4 KiB pages, and everything works as before, a little slower.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from errno import EINVAL

from gpusnap.rawmem import MADV_COLLAPSE, madvise, merge_ranges


def _pmd_size() -> int:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20  # x86-64


HUGE_PAGE = _pmd_size()


def huge_spans(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The whole, aligned huge pages inside each (address, nbytes) range, merged and sorted."""
    spans = []
    for address, nbytes in ranges:
        lo = -(-address // HUGE_PAGE) * HUGE_PAGE
        hi = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
        if hi > lo:
            spans.append((lo, hi, 0))
    return [(lo, hi) for lo, hi, _ in merge_ranges(spans)]


def collapse(ranges: Iterable[tuple[int, int]]) -> Iterator[bool]:
    """Collapse the huge pages inside ``ranges``, one per step: yields whether each one is now
    a huge page. One at a time, so that the caller can stop between two (a collapse copies
    2 MiB: a few milliseconds). A huge page already in place costs one system call."""
    for lo, hi in huge_spans(ranges):
        for address in range(lo, hi, HUGE_PAGE):
            try:
                madvise(address, HUGE_PAGE, MADV_COLLAPSE)
                error = 0
            except OSError as exc:
                error = exc.errno
            yield error == 0
            if error == EINVAL:  # a kernel without MADV_COLLAPSE, or memory that cannot have
                break  # huge pages: the rest of this storage is the same; ask the next one
