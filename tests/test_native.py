"""native/reduce.cu compiles (nvcc, and NVRTC as CuPy loads it) and matches the dispatch table.

These run on CPU-only machines: compiling needs the toolkit, not a device.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from horotopo.gpu import kernels

ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)


def _nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = Path(home) / "bin" / "nvcc"
    return str(cand) if cand.exists() else None


def _run_nvcc(tmp_path, *args):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (install the CUDA toolkit to compile-check native/)")
    cmd = [nvcc, *kernels.COMPILE_OPTIONS, *args, str(kernels.native_source_path())]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_nvcc_ptx_has_every_dispatched_kernel(tmp_path):
    out = tmp_path / "reduce.ptx"
    _run_nvcc(tmp_path, "--ptx", "-arch=compute_75", "-o", str(out))
    entries = set(ENTRY.findall(out.read_text()))
    assert entries == set(kernels.all_kernel_names())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_assembles_machine_code(tmp_path, arch):
    # ptxas checks what the PTX stage does not: the inline cvt asm and register constraints.
    out = tmp_path / f"reduce_{arch}.cubin"
    _run_nvcc(tmp_path, "--cubin", f"-arch={arch}", "-o", str(out))
    assert out.stat().st_size > 0


def _nvrtc() -> Any:
    """CuPy's NVRTC bindings. Skips where CuPy is not installed or the NVRTC library cannot be
    loaded (a CPU-only box); any other error from CuPy is a failure, not a skip."""
    pytest.importorskip("cupy", reason="CuPy is not installed (the [cuda] extra)")
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except (ImportError, RuntimeError) as exc:
        # CuPy < 13 fails the import (ImportError: libnvrtc.so...); CuPy >= 13 loads the library
        # on first use (RuntimeError: CuPy failed to load libnvrtc.so...). Both name nvrtc.
        if "nvrtc" not in str(exc).lower():
            raise
        pytest.skip(f"CuPy's NVRTC library is not available: {exc}")
    return nvrtc


def test_nvrtc_compiles_the_source_as_cupy_does():
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(kernels.native_source(), "reduce.cu", [], [])
    # CuPy's RawModule adds these two itself; the rest are the loader's options.
    opts = [*kernels.COMPILE_OPTIONS, "-arch=compute_80", "--device-as-default-execution-space"]
    try:
        nvrtc.compileProgram(prog, opts)
    except Exception as exc:
        pytest.fail(f"NVRTC rejected native/reduce.cu: {exc}\n{nvrtc.getProgramLog(prog)}")
    ptx = nvrtc.getPTX(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert set(ENTRY.findall(ptx)) == set(kernels.all_kernel_names())


def test_dispatch_table_covers_every_op_and_dtype_once():
    names = kernels.all_kernel_names()
    assert len(names) == len(set(names)) == 4 * 4 * 2 + 4
    assert kernels.kernel_name("product", "bfloat16") == "horotopo_reduce_prod_bf16"
    assert kernels.kernel_name("sum", "float16", vector=True) == "horotopo_reduce_sum_f16_v16"
    assert kernels.scale_kernel_name("float64") == "horotopo_scale_f64"


@pytest.mark.parametrize("op,dtype,match", [("average", "float32", "average"),
                                            ("sum", "int32", "int32"),
                                            ("min", "complex64", "complex64")])
def test_dispatch_rejects_what_has_no_kernel(op, dtype, match):
    with pytest.raises(ValueError, match=match):
        kernels.kernel_name(op, dtype)


def test_kernel_mode_env(monkeypatch):
    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    assert kernels.kernel_mode() == "auto"
    monkeypatch.setenv(kernels.KERNELS_ENV, "fallback")
    assert kernels.kernel_mode() == "fallback"
    monkeypatch.setenv(kernels.KERNELS_ENV, "fast")
    with pytest.raises(ValueError, match=kernels.KERNELS_ENV):
        kernels.kernel_mode()


def test_native_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv(kernels.NATIVE_DIR_ENV, str(tmp_path))
    assert kernels.native_source_path() == tmp_path / "reduce.cu"
    with pytest.raises(FileNotFoundError, match=kernels.NATIVE_DIR_ENV):
        kernels.native_source()
    (tmp_path / "reduce.cu").write_text("// x\n")
    assert kernels.native_source() == "// x\n"


def _fake_cupy(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """A stand-in cupy whose nvrtc.getVersion() raises ``error``."""
    import sys
    import types

    def get_version() -> None:
        raise error

    nvrtc = types.SimpleNamespace(getVersion=get_version)
    cuda = types.SimpleNamespace(nvrtc=nvrtc)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvrtc", nvrtc)


def test_nvrtc_skip_is_only_for_a_missing_library(monkeypatch):
    # The one condition the skip means: CuPy cannot load libnvrtc.
    _fake_cupy(monkeypatch, RuntimeError("CuPy failed to load libnvrtc.so.12: OSError: no file"))
    with pytest.raises(pytest.skip.Exception, match="NVRTC library is not available"):
        _nvrtc()
    # Anything else CuPy raises is a real failure, not a skip.
    _fake_cupy(monkeypatch, RuntimeError("CUDA driver version is insufficient"))
    with pytest.raises(RuntimeError, match="driver version"):
        _nvrtc()
