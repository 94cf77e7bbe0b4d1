"""The native reduce-step kernels (native/reduce.cu): names, source, loading and launch.

The source is compiled at run time by CuPy (RawModule, NVRTC) the first time a device reduce
runs. When it cannot be loaded (no source next to the package, an NVRTC failure), device
reduces fall back to CuPy elementwise operations (horotopo/gpu/elementwise.py), which compute
the same bits; a warning says so once.

The device steps themselves (:func:`reduce_into`, :func:`scale`, :func:`as_cupy_array`; and
:func:`synchronize`, from ``_env``) live here too, in the package's low modules, so that the
buffer layer (:mod:`horotopo.buffers`) calls them without importing the GPU package's upper
modules; :mod:`horotopo.gpu` re-exports them as its public API.

``HOROTOPO_GPU_KERNELS`` picks the path: ``auto`` (default: native, else fallback), ``native``
(fail if the kernels cannot be loaded) or ``fallback`` (never load them).
"""
from __future__ import annotations

import functools
import math
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import config
from ..ops import ReduceOp
from ..params import ENGINE, EngineParams
from .env import (OPS, canonical_dtype_name, check_op, cupy_module, is_cupy_array,
                   is_gpu_buffer, is_torch_cuda, synchronize, torch_bfloat16_as_int16)
from .elementwise import bfloat16_dtype, reduce_arrays, scale_array

#: Reduction op (:class:`horotopo.ops.ReduceOp`) -> kernel op suffix.
OP_SUFFIX: Dict[str, str] = {ReduceOp.SUM.value: "sum", ReduceOp.MIN.value: "min",
                             ReduceOp.MAX.value: "max", ReduceOp.PRODUCT.value: "prod"}
#: dtype name -> kernel dtype suffix.
DTYPE_SUFFIX: Dict[str, str] = {"float16": "f16", "bfloat16": "bf16", "float32": "f32",
                                "float64": "f64"}
#: Options for NVRTC and nvcc alike; --fmad=false keeps the results bit-equal to the CPU path.
COMPILE_OPTIONS = ("--std=c++14", "--fmad=false")
#: Bytes per vector load in the *_v16 kernels; all three pointers must be aligned to it.
VECTOR_BYTES = 16
KERNELS_ENV = "HOROTOPO_GPU_KERNELS"
NATIVE_DIR_ENV = "HOROTOPO_NATIVE_DIR"


def kernel_name(op: str, dtype: str, vector: bool = False) -> str:
    """The entry point in native/reduce.cu for one (op, dtype).

    Raises
    ------
    ValueError
        If the op or dtype has no native kernel.
    """
    check_op(op)
    if dtype not in DTYPE_SUFFIX:
        raise ValueError(f"no native kernel for dtype {dtype!r}: native kernels cover "
                         f"{', '.join(DTYPE_SUFFIX)}")
    return f"horotopo_reduce_{OP_SUFFIX[op]}_{DTYPE_SUFFIX[dtype]}" + ("_v16" if vector else "")


def scale_kernel_name(dtype: str) -> str:
    """The scale entry point (out = s * a) for one dtype."""
    if dtype not in DTYPE_SUFFIX:
        raise ValueError(f"no native kernel for dtype {dtype!r}")
    return f"horotopo_scale_{DTYPE_SUFFIX[dtype]}"


def all_kernel_names() -> List[str]:
    """Every entry point the loader may ask native/reduce.cu for."""
    names = [kernel_name(op, dt, vec) for dt in DTYPE_SUFFIX for op in OPS
             for vec in (False, True)]
    return names + [scale_kernel_name(dt) for dt in DTYPE_SUFFIX]


def native_source_path() -> Path:
    """Where native/reduce.cu is.

    ``$HOROTOPO_NATIVE_DIR`` when set; else the repository's native/ (editable installs), else
    ``<prefix>/share/horotopo/native`` (where a wheel's data_files would put it).
    """
    base = config.get(NATIVE_DIR_ENV)
    if base:
        return Path(base) / "reduce.cu"
    repo = Path(__file__).resolve().parents[2] / "native" / "reduce.cu"
    installed = Path(sys.prefix) / "share" / "horotopo" / "native" / "reduce.cu"
    return installed if not repo.is_file() and installed.is_file() else repo


def native_source() -> str:
    """The kernel source text.

    Raises
    ------
    FileNotFoundError
        When the file is missing (for example a wheel install without native/), naming the
        variable that points at it.
    """
    path = native_source_path()
    if not path.is_file():
        raise FileNotFoundError(f"native kernel source not found at {path}; set "
                                f"{NATIVE_DIR_ENV} to the directory holding reduce.cu")
    return path.read_text()


def kernel_mode() -> str:
    """The value of ``HOROTOPO_GPU_KERNELS`` (auto when unset).

    Raises
    ------
    ValueError
        (:class:`horotopo.config.ConfigError`) for a value other than auto, native or
        fallback.
    """
    mode: str = config.get(KERNELS_ENV)
    return mode


class _NativeState:
    lock = threading.Lock()
    modules: Dict[int, Any] = {}
    error: Optional[str] = None
    warned = False
    sm_count: Dict[int, int] = {}
    #: The launch geometry's parameters, read from the environment once, when the kernels
    #: are first loaded (a launch is per chunk: it must not parse settings).
    params: EngineParams = ENGINE


def load_native() -> Optional[Any]:
    """The compiled CuPy RawModule for the current device, or None when it cannot be had (the
    reason is kept, and not retried).

    One module per device: a loaded module belongs to the device it was loaded on. NVRTC
    compiles once per process and CuPy's on-disk kernel cache makes later processes cheap.
    """
    st = _NativeState
    with st.lock:
        if st.error is not None:
            return None
        if not st.modules:  # a bad value is the user's error, not a reason to fall back
            st.params = config.engine_params()
        try:
            cp = cupy_module()
            dev = cp.cuda.Device().id
            module = st.modules.get(dev)
            if module is None:
                module = cp.RawModule(code=native_source(), options=COMPILE_OPTIONS)
                # RawModule compiles lazily; fetch one entry so a compile error shows up here.
                module.get_function(kernel_name("sum", "float32"))
                st.modules[dev] = module
            return module
        except Exception as exc:  # any failure means: use the fallback, and say why
            st.error = f"{type(exc).__name__}: {exc}"
            return None


def native_error() -> Optional[str]:
    """Why the native kernels could not be loaded, or None (loaded, or not tried yet)."""
    return _NativeState.error


def backend_for(dtype: str, contiguous: bool) -> str:
    """Which path a device reduce of this dtype takes: "native" or "fallback".

    Raises
    ------
    RuntimeError
        When ``HOROTOPO_GPU_KERNELS=native`` and the kernels cannot be used.
    """
    mode = kernel_mode()
    if mode == "fallback":
        return "fallback"
    usable = dtype in DTYPE_SUFFIX and contiguous
    if usable and load_native() is not None:
        return "native"
    if mode == "native":
        why = native_error() or (f"dtype {dtype} has no native kernel" if dtype not in
                                 DTYPE_SUFFIX else "the arrays are not contiguous")
        raise RuntimeError(f"{KERNELS_ENV}=native but the native kernels cannot be used: {why}")
    if usable and not _NativeState.warned:
        _NativeState.warned = True
        warnings.warn(f"horotopo: native GPU kernels unavailable ({native_error()}); using the "
                      "CuPy elementwise fallback", RuntimeWarning, stacklevel=3)
    return "fallback"


def grid_blocks(work: int, sms: int, params: EngineParams = ENGINE) -> int:
    """Blocks of a reduce kernel's grid for ``work`` items (vectors or elements) on a device
    of ``sms`` streaming multiprocessors: one item per thread of ``params.gpu_block_threads``
    per block, at most ``params.gpu_blocks_per_sm`` blocks per SM (the kernels' grid-stride
    loop covers the rest), and at least one block."""
    return max(1, min(math.ceil(work / params.gpu_block_threads),
                      sms * params.gpu_blocks_per_sm))


def _grid(cp: Any, work: int) -> int:
    dev = cp.cuda.Device().id
    sms = _NativeState.sm_count.get(dev)
    if sms is None:
        sms = cp.cuda.Device(dev).attributes["MultiProcessorCount"]
        _NativeState.sm_count[dev] = sms
    return grid_blocks(work, sms, _NativeState.params)


def _aligned(*arrays: Any) -> bool:
    return all(a.data.ptr % VECTOR_BYTES == 0 for a in arrays)


def launch_reduce(out: Any, a: Any, b: Any, op: str, dtype: str, sa: float, sb: float,
                  post: float) -> None:
    """Launch ``out = post * ((sa * a) OP (sb * b))`` on the current CuPy stream.

    The arrays are contiguous CuPy arrays of one dtype and size on the current device.
    """
    n = out.size
    if n == 0:
        return
    cp = cupy_module()
    module = load_native()
    lanes = VECTOR_BYTES // out.dtype.itemsize
    vector = n >= lanes and _aligned(out, a, b)
    fn = module.get_function(kernel_name(op, dtype, vector))
    work = n // lanes if vector else n
    fn((_grid(cp, work),), (_NativeState.params.gpu_block_threads,),
       (a, b, out, np.float64(sa), np.float64(sb), np.float64(post), np.uint64(n)))


def launch_scale(out: Any, a: Any, dtype: str, factor: float) -> None:
    """Launch ``out = factor * a`` on the current CuPy stream."""
    n = out.size
    if n == 0:
        return
    cp = cupy_module()
    fn = load_native().get_function(scale_kernel_name(dtype))
    fn((_grid(cp, n),), (_NativeState.params.gpu_block_threads,),
       (a, out, np.float64(factor), np.uint64(n)))


# -- device steps on CuPy arrays and CUDA torch tensors (re-exported by horotopo.gpu) ------
def _as_cupy(x: Any, dtype: Optional[str]) -> Any:
    """(cupy array, dtype name) for a CuPy array or CUDA torch tensor, without copying."""
    as_int16 = torch_bfloat16_as_int16(x)
    if as_int16 is not None:  # the kernels take bfloat16 as 16-bit words, CuPy bf16 or not
        return cupy_module().asarray(as_int16), "bfloat16"
    if not is_gpu_buffer(x):
        raise TypeError(f"expected a CuPy array or a CUDA torch tensor, got {type(x).__name__} "
                        "(host arrays go through host_reduce_into)")
    arr = as_cupy_array(x)
    return arr, dtype or canonical_dtype_name(arr.dtype)


@functools.lru_cache(maxsize=1)
def cupy_bfloat16() -> Optional[np.dtype]:
    """ml_dtypes' bfloat16 when this CuPy can hold arrays of it (CuPy 14 with ml-dtypes), else
    None: older CuPy raises on the dtype, and bfloat16 then travels as 16-bit words."""
    bf16 = bfloat16_dtype()
    if bf16 is None:
        return None
    try:
        cupy_module().empty(0, dtype=bf16).view(np.uint16).view(bf16)
    except Exception:  # TypeError or NotImplementedError, depending on the CuPy version
        return None
    return bf16


def as_cupy_array(x: Any) -> Any:
    """A CuPy array over the memory of a CuPy array or CUDA torch tensor, never a copy.

    bfloat16 torch tensors become CuPy bfloat16 arrays where CuPy has the dtype
    (:func:`cupy_bfloat16`).

    Raises
    ------
    TypeError
        For anything else, and for a bfloat16 tensor when CuPy lacks bfloat16 (the message
        says what to install).
    """
    if is_cupy_array(x):
        return x
    if is_torch_cuda(x):
        x = x.detach()  # a tensor that requires grad refuses __cuda_array_interface__
    as_int16 = torch_bfloat16_as_int16(x)
    if as_int16 is not None:
        bf16 = cupy_bfloat16()
        if bf16 is None:
            raise TypeError("bfloat16 CUDA tensors need CuPy with bfloat16 (CuPy >= 14 and "
                            "ml-dtypes: pip install 'cupy-cuda12x>=14' ml-dtypes)")
        return cupy_module().asarray(as_int16).view(bf16)
    if is_torch_cuda(x):
        return cupy_module().asarray(x)  # zero-copy through __cuda_array_interface__
    raise TypeError(f"expected a CuPy array or a CUDA torch tensor, got {type(x).__name__}")


def _checked_pair(dst: Any, src: Any, dtype: Optional[str]) -> Tuple[Any, Any, str]:
    a, name = _as_cupy(dst, dtype)
    b, src_name = _as_cupy(src, dtype)
    if name != src_name or a.dtype != b.dtype:
        raise ValueError(f"reduce needs equal dtypes, got {name} and {src_name}")
    if a.size != b.size:
        raise ValueError(f"reduce needs equal sizes, got {a.size} and {b.size}")
    if a.device.id != b.device.id:
        raise ValueError(f"reduce needs both arrays on one device, got devices {a.device.id} "
                         f"and {b.device.id}")
    return a, b, name


def backend(dst: Any, dtype: Optional[str] = None) -> str:
    """Which path :func:`reduce_into` takes for this array: "native" or "fallback"."""
    a, name = _as_cupy(dst, dtype)
    return backend_for(name, bool(a.flags.c_contiguous))


def reduce_into(dst: Any, src: Any, op: str, prescale: float = 1.0, postscale: float = 1.0,
                *, src_scale: float = 1.0, dtype: Optional[str] = None) -> Any:
    """One reduce step on the device: ``dst = postscale * ((prescale * dst) OP (src_scale * src))``.

    Parameters
    ----------
    dst, src : cupy.ndarray or CUDA torch.Tensor
        Same size, dtype and device. ``dst`` is overwritten; ``src`` is only read.
    op : str
        "sum", "min", "max" or "product" (average: sum, then postscale 1/size at the root).
    prescale : float
        Multiplies ``dst``, the local contribution: pass Horovod's prescale_factor on the step
        that first combines a rank's own data, and 1.0 on later steps (the children's partial
        results were prescaled where they started). A leaf uses :func:`scale` instead.
    postscale : float
        Multiplies the result: Horovod's postscale_factor (or 1/size for average) on the last
        step at the root, 1.0 elsewhere.
    src_scale : float
        Multiplies ``src``; 1.0 for the engine's use.
    dtype : str, optional
        "bfloat16" when bfloat16 data sits in a 2-byte integer array (CuPy has no bfloat16);
        bfloat16 torch tensors are recognised without it.

    Returns
    -------
    same as ``dst``
        ``dst``. The work is queued on the current stream: call :func:`synchronize` before MPI
        reads ``dst``.

    Raises
    ------
    ValueError
        Unknown op, mismatched arrays, or scale factors on an integer dtype.
    """
    check_op(op)
    a, b, name = _checked_pair(dst, src, dtype)
    if name == "bfloat16" and a.dtype.itemsize != 2:
        raise ValueError(f"bfloat16 data must be in a 2-byte dtype, got {a.dtype}")
    contiguous = bool(a.flags.c_contiguous and b.flags.c_contiguous)
    if backend_for(name, contiguous) == "native":
        with a.device:
            launch_reduce(a, a, b, op, name, prescale, src_scale, postscale)
    else:
        with a.device:
            reduce_arrays(cupy_module(), a, b, op, prescale, postscale, src_scale, name)
    return dst


def scale(dst: Any, factor: float, *, dtype: Optional[str] = None) -> Any:
    """``dst *= factor`` on the device, rounded like :func:`reduce_into`'s scale factors."""
    a, name = _as_cupy(dst, dtype)
    if factor == 1.0:
        return dst
    if backend_for(name, bool(a.flags.c_contiguous)) == "native":
        with a.device:
            launch_scale(a, a, name, factor)
    else:
        with a.device:
            scale_array(cupy_module(), a, factor, name)
    return dst
