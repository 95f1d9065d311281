"""The device side: everything gpusnap does with a GPU goes through one ``GpuBackend``.

Modules, in the order a snapshot meets them:

- ``backend``     the interface (``GpuBackend``, its call order) and its data: ``DeviceInfo``,
                  ``PointerInfo``, ``AllocKind``, ``Allocation`` (a raw-allocation registry entry)
- ``registry``    raw allocations the program makes through cuda-python (``track`` wraps them)
- ``tracking``    the run's one registry, installed by boot (on import of the bindings)
- ``cuda``        ``CudaBackend``: cuda-python's driver API (``cuda.bindings.driver``)
- ``fake``        the strict fake GPU for CI: fake ``cuda.bindings`` and ``cuda.core`` modules and ``FakeBackend``
- ``fingerprint`` the dirty-chunk fingerprint's definition (NumPy reference)
- ``kernels``     the CUDA kernels' source (``*.cu`` here) and their NVRTC compilation
- ``calls``       cuda-python's ``(status, outputs...)`` convention turned into gpusnap errors

Nothing here imports the pipeline (capture, stage, restore): ``stage`` imports this package.

Entry points for the pipeline:

- boot, before the program's imports: ``tracking.install()``, which runs ``fake.install()``
  first when ``GPUSNAP_DEVICE=fake`` and ``registry.track`` on the bindings once imported;
- staging, in the trainee (``stage.device``): ``open_backend(kind)``, then the call order on ``GpuBackend``;
  ``fingerprint.chunk_spans`` / ``chunk_count`` cut ranges as the store does, and
  ``fingerprint.dirty_chunks(previous, current)`` picks what to copy;
- restore: ``Registry.live()`` entries match by (call_site, ordinal, nbytes, kind);
  ``copy_to_device`` writes into the replayed program's allocations;
- tests: ``fake.reset()`` for a fresh fake GPU, ``fake.FakeBackend()``.
"""

from __future__ import annotations

from gpusnap.device.backend import AllocKind, Allocation, DeviceInfo, GpuBackend, PointerInfo  # noqa: F401

BACKENDS = ("cuda", "fake")


def open_backend(kind: str = "cuda") -> GpuBackend:
    """The backend of ``kind``: "cuda" (raises ``NoDevice`` without a driver) or "fake"."""
    if kind == "cuda":
        from gpusnap.device.cuda import CudaBackend

        return CudaBackend()
    if kind == "fake":
        from gpusnap.device.fake import FakeBackend

        return FakeBackend()
    raise ValueError(f"unknown device backend {kind!r}; one of {', '.join(BACKENDS)}")
