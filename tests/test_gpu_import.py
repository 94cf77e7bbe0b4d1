"""horotopo.gpu on a machine without CuPy, or with CuPy but no device."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

from horotopo import gpu
from horotopo.gpu import kernels

NO_CUPY = """
import sys
sys.modules["cupy"] = None  # any 'import cupy' now raises ImportError
import numpy as np
import horotopo.gpu as g
assert "cupy" not in [m for m in sys.modules if sys.modules[m] is not None]
ok, why = g.device_status()
assert not ok and "horotopo[cuda]" in why, why
assert g.is_gpu_buffer(np.zeros(2)) is False
try:
    g.reduce_into(np.zeros(2), np.zeros(2), "sum")
except TypeError as e:
    assert "host_reduce_into" in str(e)
else:
    raise AssertionError("host arrays must be refused")
from horotopo.gpu import kernels
assert kernels.load_native() is None and "CuPy" in kernels.native_error()
g.host_reduce_into(np.ones(2), np.ones(2), "sum")
g.synchronize(np.zeros(2))  # host arrays: nothing to wait for
print("OK")
"""


def test_imports_and_degrades_without_cupy():
    proc = subprocess.run([sys.executable, "-c", NO_CUPY], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stdout + proc.stderr


def test_import_does_not_import_cupy():
    code = "import sys, horotopo.gpu; print(sys.modules.get('cupy') is not None)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr


class _FakeCupy:
    """Looks like a cupy array to the type check (module name) without being one."""


_FakeCupy.__module__ = "cupy._core.core"


def test_array_kind_checks_use_the_type_only():
    assert gpu.is_gpu_buffer(np.zeros(1)) is False
    fake = _FakeCupy()
    fake.data, fake.dtype = None, np.float32
    assert gpu.is_gpu_buffer(fake) is True


@pytest.fixture
def fresh_native(monkeypatch):
    st = kernels._NativeState
    saved = (dict(st.modules), st.error, st.warned)
    st.modules, st.error, st.warned = {}, None, False
    yield st
    st.modules, st.error, st.warned = saved


def test_forcing_native_without_a_device_is_a_clear_error(monkeypatch, fresh_native):
    if gpu.device_status()[0]:
        pytest.skip("a CUDA device is present: the native kernels load")
    monkeypatch.setenv(kernels.KERNELS_ENV, "native")
    with pytest.raises(RuntimeError, match="HOROTOPO_GPU_KERNELS=native"):
        kernels.backend_for("float32", True)


def test_auto_falls_back_once_with_a_warning(monkeypatch, fresh_native):
    if gpu.device_status()[0]:
        pytest.skip("a CUDA device is present: the native kernels load")
    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="fallback"):
        assert kernels.backend_for("float32", True) == "fallback"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.backend_for("float16", True) == "fallback"
    # Types without a native kernel take the fallback with no warning at all.
    assert kernels.backend_for("int64", True) == "fallback"


def test_gpu_check_script_fails_without_a_device(tmp_path):
    """benchmarks/gpu_check.sh must not pass on a machine where it cannot check anything."""
    import os
    from pathlib import Path

    from horotopo.gpu import device_status

    if device_status()[0]:
        pytest.skip("a CUDA device is present: gpu_check.sh is run for real by its own step")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
    # HOROTOPO_WHEELS at an empty folder: a developer's .whl/ (wheels for the GPU machine's
    # Python) must not decide this test
    (tmp_path / "no-wheels").mkdir()
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable,
               HOROTOPO_WHEELS=str(tmp_path / "no-wheels"))
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=180,
                          env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (tmp_path / "summary.txt").read_text().startswith("env: FAIL"), proc.stderr[-2000:]


def test_gpu_check_budget_refuses_steps_once_spent(tmp_path):
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
    text = script.read_text()
    # Only the budget logic and the step function, on a 30 s budget: the first step is cut to
    # the 20 s left (30 less a 10 s margin) and takes 6; then 14 s are left, under the 15 s floor.
    head = text[text.index("say() {"):text.index('say "python:')]
    probe = f"""set -uo pipefail
OUTDIR={tmp_path}; SUMMARY={tmp_path}/summary.txt; FAILED=0; : > "$SUMMARY"
GPU_CHECK_BUDGET_S=30
{head}
step quick 100 sleep 6
step late 100 true
echo "FAILED=$FAILED"
"""
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("quick: PASS"), summary
    assert "(limit 20s)" in proc.stderr or "(limit 19s)" in proc.stderr, proc.stderr
    assert "budget is spent" in summary[1] and "FAILED=1" in proc.stdout, (summary, proc.stdout)
