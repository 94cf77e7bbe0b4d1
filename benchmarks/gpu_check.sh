#!/usr/bin/env bash
# GPU check for horotopo, sized for one GPU and under 10 minutes:
#   1. environment: the device, CuPy, NVRTC, the MPI library and its CUDA-awareness;
#   2. single-process GPU tests (native kernels and fallback against the host, bit for bit);
#   3. multi-rank GPU tests with 2, 3 and 4 ranks sharing the GPU (engine allreduce of CuPy
#      buffers, staged and, when MPI is CUDA-aware, direct; the hvd API on CuPy arrays and,
#      where torch has CUDA, CUDA tensors, with no host copies); the torch.distributed
#      backend's tests at 2 and 3 ranks (CUDA tensors against gloo);
#   4. the kernel micro-benchmark: GB/s per dtype/op against the device copy bandwidth, and
#      the device path's cost figures for the simulator's gpu profile (benchmarks/gpu_costs.py);
#   5. an allreduce of CuPy buffers through the engine, checked against MPI on host copies.
# HOROTOPO_TEST_GPU=1 is set throughout: a test that would skip for lack of a device fails.
# Results go to $OUT (when set, as on the device machine) or out/gpu_check-<time>/ (ignored);
# summary.txt there holds the verdict per step. Exit status 0 only when every step passed.
#
#   bash benchmarks/gpu_check.sh            # PYTHON=/path/to/python to pick the interpreter
#
# Interpreter: $PYTHON, else .venv/bin/python, else python3. A machine without an MPI (the lent
# GPU machines' image lists mpi4py and CuPy but no MPI package) takes wheels from .whl/ (or
# $HOROTOPO_WHEELS): they are installed under /tmp/horotopo-prefix first, and their mpiexec
# and libmpi are used. To bring MPICH, on a machine with pip and the registry, in the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl mpich==5.0.2
# and carry .whl with the run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
OUTDIR="${OUT:-$ROOT/out/gpu_check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUTDIR"
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
MPIEXEC=""
WHEELS="${HOROTOPO_WHEELS:-$ROOT/.whl}"
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    PREFIX=/tmp/horotopo-prefix
    echo "[gpu_check] installing $(ls "$WHEELS"/*.whl | wc -l) wheel(s) from $WHEELS into $PREFIX" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed \
        --prefix "$PREFIX" "$WHEELS"/*.whl
    SITE="$("$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "$PREFIX")"
    export PYTHONPATH="$PYTHONPATH:$SITE"
    export PATH="$PREFIX/bin:$PATH"
    export LD_LIBRARY_PATH="$PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if [ -e "$PREFIX/lib/libmpi.so.12" ]; then export MPI4PY_LIBMPI="$PREFIX/lib/libmpi.so.12"; fi
    if [ -x "$PREFIX/bin/mpiexec" ]; then MPIEXEC="$PREFIX/bin/mpiexec"; fi
fi
if [ -z "$MPIEXEC" ]; then
    MPIEXEC="$(dirname "$PY")/mpiexec"
    [ -x "$MPIEXEC" ] || MPIEXEC="$(command -v mpiexec || true)"
fi
export HOROTOPO_TEST_GPU=1
export PYTHONUNBUFFERED=1
FAILED=0

say() { echo "[gpu_check] $*" >&2; }
record() { echo "$1: $2" | tee -a "$SUMMARY" >&2; }

# The whole check fits in GPU_CHECK_BUDGET_S (default 570 s, under the 10 minutes a lent GPU
# gives one command): each step gets its own limit or what is left of the budget, whichever
# is less, and a step with under 15 s left is recorded as a failure without running.
BUDGET_S="${GPU_CHECK_BUDGET_S:-570}"
DEADLINE=$((SECONDS + BUDGET_S))

# step NAME SECONDS CMD...: run with a hard timeout, log to $OUTDIR/NAME.log, record the verdict.
step() {
    local name="$1" secs="$2"; shift 2
    local left=$((DEADLINE - SECONDS - 10))
    if [ "$left" -lt 15 ]; then
        record "$name" "FAIL (not run: the ${BUDGET_S} s budget is spent)"
        FAILED=1
        return 0
    fi
    [ "$secs" -gt "$left" ] && secs="$left"
    say "== $name (limit ${secs}s): $*"
    local t0=$SECONDS rc=0
    timeout --kill-after=10 "$secs" "$@" > "$OUTDIR/$name.log" 2>&1 || rc=$?
    tail -n 25 "$OUTDIR/$name.log" >&2
    if [ "$rc" -eq 0 ]; then
        record "$name" "PASS ($((SECONDS - t0)) s)"
    else
        [ "$rc" -eq 124 ] && say "$name timed out after ${secs}s"
        record "$name" "FAIL rc=$rc ($((SECONDS - t0)) s, log $OUTDIR/$name.log)"
        FAILED=1
    fi
}

say "python: $PY; mpiexec: ${MPIEXEC:-none}; output: $OUTDIR"
step env 120 "$PY" - <<'PYEOF'
import sys
import numpy, cupy
from horotopo import gpu
from horotopo.gpu import kernels
ok, why = gpu.device_status()
print("numpy", numpy.__version__, "cupy", cupy.__version__)
if not ok:
    sys.exit(f"no usable CUDA device: {why}")
n = cupy.cuda.runtime.getDeviceCount()
for d in range(n):
    p = cupy.cuda.runtime.getDeviceProperties(d)
    print(f"device {d}: {p['name'].decode()} cc {p['major']}.{p['minor']} "
          f"{p['totalGlobalMem'] / 2**30:.1f} GiB")
print("CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(), "driver",
      cupy.cuda.runtime.driverGetVersion(), "NVRTC", cupy.cuda.nvrtc.getVersion())
mod = kernels.load_native()
print("native kernels:", "loaded" if mod is not None else f"NOT loaded: {kernels.native_error()}")
try:
    from mpi4py import MPI
    print("MPI:", MPI.Get_library_version().splitlines()[0])
    print("MPI library CUDA query:", gpu.query_mpi_library())
    print("cuda_aware(COMM_WORLD):", gpu.cuda_aware(MPI.COMM_WORLD))
except ImportError as exc:
    print("mpi4py missing:", exc)
sys.exit(0 if mod is not None else 1)
PYEOF
if [ "$FAILED" -ne 0 ]; then
    say "GPU check FAILED at the environment step: nothing else can run (see $OUTDIR/env.log)"
    exit 1
fi

step unit 240 "$PY" -m pytest -q -p no:cacheprovider -x tests/test_gpu_device.py tests/test_native.py \
    tests/test_gpu_staging.py tests/test_gpu_host.py tests/test_gpu_aware.py tests/test_gpu_import.py

step kernel_bench 150 sh -c "\"$PY\" benchmarks/kernel_bench.py --size 256M --json --markdown \"$OUTDIR/kernel_bench.md\" > \"$OUTDIR/kernel_bench.json\""
# the device figures of the simulator's gpu cost profile (docs/calibration.md)
step gpu_costs 120 sh -c "\"$PY\" benchmarks/gpu_costs.py --repeats 15 --json --markdown \"$OUTDIR/gpu_costs.md\" --profile \"$OUTDIR/gpu_costs_profile.json\" > \"$OUTDIR/gpu_costs.json\""

if [ -z "$MPIEXEC" ]; then
    record "mpi" "FAIL (no mpiexec next to $PY or on PATH)"
    FAILED=1
else
    for n in 2 3 4; do
        step "mpi_n$n" 120 "$MPIEXEC" -n "$n" "$PY" -m pytest -q -p no:cacheprovider -x \
            tests/mpi/test_gpu_mpi.py tests/mpi/test_gpu_staging_mpi.py tests/mpi/test_gpu_api_mpi.py
    done
    # the torch.distributed backend's CUDA path (collectives and send/recv of CUDA tensors),
    # against gloo in the same job, as the MPI tier runs it
    for n in 2 3; do
        step "torch_dist_n$n" 150 env HOROTOPO_MPI_TIER=1 "$MPIEXEC" -n "$n" "$PY" -m pytest -q \
            -p no:cacheprovider -x tests/mpi/test_torch_distributed.py
    done
fi


if [ -n "$MPIEXEC" ]; then
    step allreduce_n4 150 sh -c "\"$MPIEXEC\" -n 4 \"$PY\" benchmarks/gpu_allreduce.py --sizes 1M,16M,64M --json --markdown \"$OUTDIR/gpu_allreduce.md\" > \"$OUTDIR/gpu_allreduce.json\""
fi

say "== summary ($OUTDIR/summary.txt)"
cat "$SUMMARY" >&2
if [ "$FAILED" -ne 0 ]; then
    say "GPU check FAILED"
    exit 1
fi
say "GPU check passed"
