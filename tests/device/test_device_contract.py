"""The fake cuda.bindings modules held against the real cuda-bindings package (installed by the
test extras; it needs no GPU): every fake function exists there with the same parameters and
returns a tuple of the same length, and every enum member the fake names exists. The fake
cuda.core against the real cuda-core: every class and member exists there, properties are
properties, and methods take the same parameters (names, and which are keyword-only)."""

from __future__ import annotations

import inspect
import pathlib
import re
import types

import pytest

from gpusnap.device import calls
from gpusnap.device import fake as fake_pkg
from gpusnap.device.fake import driver as fake_driver
from gpusnap.device.fake import runtime as fake_runtime
from gpusnap.errors import NoDevice

real_driver = pytest.importorskip("cuda.bindings.driver")
real_runtime = pytest.importorskip("cuda.bindings.runtime")
PAIRS = [(fake_driver, real_driver), (fake_runtime, real_runtime)]
FUNCTIONS = [(fake, real, name) for fake, real in PAIRS for name in fake.__all__]


def documented_outputs(fn) -> int:
    """How many values follow the status in what ``fn`` returns, from its numpydoc Returns
    section: one line per returned value at the section's indentation, the status first."""
    lines = fn.__doc__.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "Returns" and lines[i + 1].strip().startswith("---"))
    indent = len(lines[at]) - len(lines[at].lstrip())
    values = 0
    for line in lines[at + 2 :]:
        if not line.strip():
            break
        values += len(line) - len(line.lstrip()) == indent
    return values - 1


def documented_types(fn) -> list[str]:
    """The declared type of each returned value after the status ("CUdeviceptr", "int", ...)."""
    lines = fn.__doc__.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "Returns" and lines[i + 1].strip().startswith("---"))
    indent = len(lines[at]) - len(lines[at].lstrip())
    types = []
    for line in lines[at + 2 :]:
        if not line.strip():
            break
        if len(line) - len(line.lstrip()) == indent:
            types.append(line.split(" : ", 1)[-1].strip().replace(":py:obj:`~.", "").rstrip("`"))
    return types[1:]


def libcuda_loads() -> bool:
    try:
        real_driver.cuDriverGetVersion()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("fake,real,name", FUNCTIONS, ids=[f"{f.__name__.rsplit('.', 1)[1]}.{n}" for f, _, n in FUNCTIONS])
def test_each_fake_function_has_the_real_ones_parameters_and_result_shape(fake, real, name):
    real_fn = getattr(real, name, None)
    assert callable(real_fn), f"{name} is not in {real.__name__}"
    fake_params = list(inspect.signature(getattr(fake, name)).parameters)
    assert fake_params == list(inspect.signature(real_fn).parameters)
    assert getattr(fake, name).outputs == documented_outputs(real_fn)


def test_the_fake_modules_cover_what_the_design_lists():
    wanted = """cuInit cuDeviceGet cuDeviceGetCount cuDeviceGetName cuDeviceGetAttribute cuDeviceTotalMem
        cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease cuDevicePrimaryCtxGetState cuCtxCreate cuCtxDestroy
        cuCtxGetCurrent cuCtxSetCurrent cuCtxPushCurrent cuCtxPopCurrent cuCtxSynchronize cuMemAlloc cuMemAllocPitch
        cuMemAllocManaged cuMemAllocAsync cuMemFree cuMemFreeAsync cuMemcpyDtoH cuMemcpyDtoHAsync cuMemcpyHtoD
        cuMemcpyHtoDAsync cuStreamCreate cuStreamDestroy cuStreamSynchronize cuStreamQuery cuMemHostRegister
        cuMemHostUnregister cuMemCreate cuMemMap cuMemUnmap cuMemRelease cuMemSetAccess cuMemAddressReserve
        cuMemAddressFree cuMemGetAddressRange cuPointerGetAttribute""".split()
    assert set(wanted) <= set(fake_driver.__all__)
    assert {"cudaMalloc", "cudaMallocManaged", "cudaMallocAsync", "cudaFree", "cudaMemcpy"} <= set(fake_runtime.__all__)


def test_types_and_enums_are_the_real_ones_and_real_functions_are_never_lent():
    for name in ("CUresult", "CUdeviceptr", "CUstream", "CUmemAllocationProp", "CUmemAccessDesc", "CU_MEMHOSTREGISTER_PORTABLE"):
        assert getattr(fake_driver, name) is getattr(real_driver, name)
    assert fake_runtime.cudaMemcpyKind is real_runtime.cudaMemcpyKind
    with pytest.raises(AttributeError, match="does not model cuGraphLaunch"):
        fake_driver.cuGraphLaunch
    with pytest.raises(AttributeError):
        fake_driver.cuNoSuchFunction


def test_every_status_and_attribute_name_the_fake_and_the_hints_use_exists():
    source = "".join(p.read_text() for p in pathlib.Path(fake_pkg.__file__).parent.glob("*.py"))
    for status in set(re.findall(r'"(CUDA_ERROR_[A-Z_]+)"', source)):
        assert hasattr(real_driver.CUresult, status), status
    for status in fake_runtime.TO_RUNTIME.values():
        assert hasattr(real_runtime.cudaError_t, status), status
    for attribute in fake_driver._ATTRIBUTES:
        assert hasattr(real_driver.CUdevice_attribute, attribute), attribute
    for attribute in set(re.findall(r'"(CU_POINTER_ATTRIBUTE_[A-Z_]+)"', source)):
        assert hasattr(real_driver.CUpointer_attribute, attribute), attribute
    for status in calls._HINTS:
        enum = real_driver.CUresult if status.startswith("CUDA_") else real_runtime.cudaError_t
        assert hasattr(enum, status), status


@pytest.mark.skipif(libcuda_loads(), reason="a driver is installed: the no-driver behaviour cannot be seen")
def test_without_a_driver_the_real_runtime_returns_tuples_of_the_fakes_length():
    kind = real_runtime.cudaMemcpyKind.cudaMemcpyDefault
    checked = 0
    for name in fake_runtime.__all__:
        if name in ("cudaGetErrorName", "cudaGetErrorString", "cudaDriverGetVersion", "cudaRuntimeGetVersion"):
            continue  # these answer without a driver
        params = inspect.signature(getattr(real_runtime, name)).parameters
        args = [kind if p == "kind" else 0 for p in params]
        result = getattr(real_runtime, name)(*args)
        assert isinstance(result, tuple) and result[0] == real_runtime.cudaError_t.cudaErrorInsufficientDriver, name
        assert len(result) == 1 + getattr(fake_runtime, name).outputs, name
        assert all(value is None for value in result[1:]), name
        checked += 1
    assert checked >= 15


@pytest.mark.skipif(libcuda_loads(), reason="a driver is installed: the no-driver behaviour cannot be seen")
def test_without_a_driver_the_real_driver_raises_and_the_backend_says_no_device():
    # Unlike the runtime, the driver module cannot load libcuda and raises instead of returning
    # a status; the backend turns that into one line with a hint.
    with pytest.raises(RuntimeError):
        real_driver.cuInit(0)
    from gpusnap.device.cuda import CudaBackend

    with pytest.raises(NoDevice) as err:
        CudaBackend()
    assert str(err.value).startswith("the CUDA driver cannot be loaded") and "\n" not in str(err.value)
    assert "nvidia-smi" in err.value.hint


def test_what_fake_calls_return_has_the_documented_types():
    fake_pkg.reset(devices=1, device_bytes=64 << 20)
    cu, rt = fake_driver, fake_runtime
    cu.cuInit(0)
    dev = cu.cuDeviceGet(0)[1]
    ctx = cu.cuDevicePrimaryCtxRetain(dev)[1]
    cu.cuCtxPushCurrent(ctx)
    ptr = cu.cuMemAlloc(4096)[1]
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    calls = {
        "cuDeviceGet": (cu, (0,)),
        "cuDeviceGetCount": (cu, ()),
        "cuDeviceGetName": (cu, (64, dev)),
        "cuDeviceTotalMem": (cu, (dev,)),
        "cuDeviceGetUuid": (cu, (dev,)),
        "cuDevicePrimaryCtxRetain": (cu, (dev,)),
        "cuDevicePrimaryCtxGetState": (cu, (dev,)),
        "cuCtxGetCurrent": (cu, ()),
        "cuCtxGetDevice": (cu, ()),
        "cuMemAlloc": (cu, (16,)),
        "cuMemAllocPitch": (cu, (16, 2, 4)),
        "cuMemAllocManaged": (cu, (16, 1)),
        "cuMemGetAddressRange": (cu, (ptr,)),
        "cuMemGetInfo": (cu, ()),
        "cuStreamCreate": (cu, (0,)),
        "cuEventCreate": (cu, (0,)),
        "cuMemCreate": (cu, (2 << 20, prop, 0)),
        "cuMemAddressReserve": (cu, (2 << 20, 0, 0, 0)),
        "cuMemGetAllocationGranularity": (cu, (prop, 0)),
        "cuDriverGetVersion": (cu, ()),
        "cuGetErrorName": (cu, (cu.CUresult.CUDA_ERROR_INVALID_VALUE,)),
        "cudaGetDeviceCount": (rt, ()),
        "cudaGetDevice": (rt, ()),
        "cudaStreamCreate": (rt, ()),
        "cudaMallocPitch": (rt, (16, 2)),
        "cudaRuntimeGetVersion": (rt, ()),
    }
    builtin = {"int": int, "unsigned int": int, "bytes": bytes}
    for name, (module, args) in calls.items():
        result = getattr(module, name)(*args)
        assert int(result[0]) == 0, (name, result[0])
        real = real_driver if module is cu else real_runtime
        for value, declared in zip(result[1:], documented_types(getattr(real, name)), strict=True):
            if declared == "Any":
                continue
            expected = builtin.get(declared) or getattr(real, declared)
            assert isinstance(value, expected), (name, declared, type(value))
    cu.cuCtxPopCurrent()



# ---- the fake cuda.core against the real one (cuda-core, installed with cuda-python)

real_core = pytest.importorskip("cuda.core")
from gpusnap.device.fake import core as fake_core  # noqa: E402

CORE_CLASSES = [name for name in fake_core.__all__ if isinstance(getattr(fake_core, name), type)]
CORE_MEMBERS = [(cls, name) for cls in CORE_CLASSES for name in dir(getattr(fake_core, cls))
                if not name.startswith("_")]


def parameters(obj) -> list[tuple[str, str]]:
    """(name, kind) of each parameter of a function but self and cls: from the first line of its
    docstring where that is a signature (Cython writes "Device.allocate(self, int size: int, *,
    stream: ...)"), else from ``inspect.signature`` (``__text_signature__``, or Python code)."""
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    if doc and re.match(rf"^[\w.]*\b{re.escape(obj.__name__)}\(", doc[0]):
        found = _documented(doc[0])
    else:
        found = [(p.name, _KINDS[p.kind]) for p in inspect.signature(obj).parameters.values()]
    return [p for p in found if p[0] not in ("self", "cls")]


def constructor(cls) -> list[tuple[str, str]]:
    """The parameters a class is made with: those of the nearest class in its MRO that documents
    a signature ("Buffer(*args, **kwargs)") or defines an ``__init__`` or ``__new__`` in Python
    (or Cython's Python-level functions); a C slot says nothing."""
    for klass in cls.__mro__[:-1]:
        doc = (klass.__doc__ or "").strip().splitlines()
        if doc and doc[0].startswith(f"{klass.__name__}("):
            return _documented(doc[0])
        for method in ("__init__", "__new__"):
            function = vars(klass).get(method)
            function = getattr(function, "__func__", function)  # a staticmethod's
            if type(function).__name__ in ("function", "cython_function_or_method"):
                return parameters(function)
    return []


_KINDS = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
          inspect.Parameter.KEYWORD_ONLY: "keyword", inspect.Parameter.VAR_POSITIONAL: "var",
          inspect.Parameter.VAR_KEYWORD: "var"}


def _documented(line: str) -> list[tuple[str, str]]:
    """Parameters of a signature line: names after their Cython type, "*" starting keywords."""
    inside, depth, parts, part = line[line.index("(") + 1 :], 0, [], ""
    for char in inside:
        if char == ")" and depth == 0:
            break
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            parts, part = parts + [part.strip()], ""
        else:
            part += char
    parts.append(part.strip())
    found, kind = [], "positional"
    for part in filter(None, parts):
        if part in ("*", "/"):
            kind = "keyword" if part == "*" else kind
            continue
        head = part.split(":")[0].split("=")[0].split()[-1]
        found.append((head.lstrip("*"), "var" if head.startswith("*") else kind))
    return found


def _is_property(attr) -> bool:
    return isinstance(attr, (property, types.GetSetDescriptorType, types.MemberDescriptorType))


def test_every_name_the_fake_cuda_core_exports_is_a_real_one():
    for name in fake_core.__all__:
        assert hasattr(real_core, name), name
    for name in ("Buffer", "ManagedBuffer", "Device", "Stream", "DeviceMemoryResource", "ManagedMemoryResource",
                 "LegacyPinnedMemoryResource", "LEGACY_DEFAULT_STREAM"):
        assert name in fake_core.__all__, name


@pytest.mark.parametrize("cls", CORE_CLASSES)
def test_each_fake_cuda_core_class_is_made_with_the_real_ones_parameters(cls):
    assert constructor(getattr(fake_core, cls)) == constructor(getattr(real_core, cls))


@pytest.mark.parametrize("cls,name", CORE_MEMBERS, ids=[f"{c}.{n}" for c, n in CORE_MEMBERS])
def test_each_fake_cuda_core_member_is_a_real_one_of_the_same_kind_and_parameters(cls, name):
    fake_cls, real_cls = getattr(fake_core, cls), getattr(real_core, cls)
    assert hasattr(real_cls, name), f"{cls}.{name} is not in cuda.core"
    is_property = _is_property(inspect.getattr_static(fake_cls, name))
    assert is_property == _is_property(inspect.getattr_static(real_cls, name)), f"{cls}.{name}: property or method"
    if not is_property:
        assert parameters(getattr(fake_cls, name)) == parameters(getattr(real_cls, name))
