"""`gpusnap ls`, `inspect`, `verify`, `gc`, `export` (being written)."""
