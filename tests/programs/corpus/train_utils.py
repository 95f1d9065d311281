"""Helpers a script imports from its own folder, keeping state the way helper modules do: a
module-level step counter bumped through `global`, a registry of metrics filled as training goes,
and a warmup factor cached in a module dict."""
import math

GLOBAL_STEP = 0
METRICS = {}
_cache = {}


def bump():
    global GLOBAL_STEP
    GLOBAL_STEP += 1
    return GLOBAL_STEP


def record(name, value):
    METRICS.setdefault(name, []).append(value)


def lr_factor(step, warmup=12, total=60):
    if step not in _cache:
        _cache[step] = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
    return _cache[step]
