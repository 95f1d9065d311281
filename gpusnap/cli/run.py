"""`gpusnap run`, `gpusnap restart`, `gpusnap snap` (being written)."""
