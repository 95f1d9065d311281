"""Global snapshots of a torchrun job: where the ranks meet (``plan``, pure), the threads and
c10d store traffic that agree on it (``coordinator``), and the checks on what is read there
(``check``)."""
