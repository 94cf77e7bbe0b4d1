#!/usr/bin/env bash
# Runs Horovod 0.28.1's own PyTorch test file (test/parallel/test_torch.py, CPU tests, MPI
# controller) against horotopo, unchanged, through a `horovod` package that re-exports
# horotopo.torch.
#
#   bash benchmarks/horovod_suite.sh HOROVOD_SOURCE [MODE] [SIZES]
#
# HOROVOD_SOURCE: either a git checkout (or bare mirror) of github.com/horovod/horovod, from
#   which test/parallel/test_torch.py is read at tag $HOROVOD_TAG (default v0.28.1) with
#   `git show`, or the path of test_torch.py itself. This repository does not carry Horovod's
#   code.
# MODE: "file" (default): the whole file in one pytest run per size;
#   "each": every test in its own mpiexec run (slow: about 100 launches per size; with
#   HOROVOD_SUITE_ONLY=REGEX, only the tests whose names match it);
#   or a pytest -k expression, run in one pytest run per size.
# SIZES: space-separated rank counts (default "2 3").
#
# PYTHON (default: .venv/bin/python beside this repository) must have horotopo, torch, mpi4py
# and pytest; mpiexec is taken from its bin folder. HOROVOD_SUITE_TIMEOUT_S bounds one mpiexec
# run (default 480 s for "file", 120 s for "each"). Prints passed/failed/skipped counts per size
# (a test counts as failed if it failed on any rank) and exits with the number of runs that had
# a failure or did not finish. HOROVOD_SUITE_MARKDOWN=PATH also writes the results, stamped
# with the date, commit and machine, to PATH (docs/results/horovod_suite.md by convention).
set -uo pipefail
source_arg="${1:?usage: horovod_suite.sh HOROVOD_SOURCE [file|each|-k EXPR] [SIZES]}"
mode="${2:-file}"
sizes="${3:-2 3}"
tag="${HOROVOD_TAG:-v0.28.1}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
bindir="$(dirname "$py")"
mpiexec="$bindir/mpiexec"
[ -x "$mpiexec" ] || mpiexec="$(command -v mpiexec)"
work="$(mktemp -d)"
if [ -n "${HOROVOD_SUITE_KEEP:-}" ]; then
  echo "horovod_suite.sh: logs kept in $work" >&2
else
  trap 'rm -rf "$work"' EXIT
fi

mkdir -p "$work/parallel" "$work/utils" "$work/shim/horovod/torch" "$work/results"
if [ -f "$source_arg" ]; then
  cp "$source_arg" "$work/parallel/test_torch.py"
elif ! git --git-dir="$source_arg/.git" show "$tag:test/parallel/test_torch.py" \
        >"$work/parallel/test_torch.py" 2>/dev/null &&
     ! git --git-dir="$source_arg" show "$tag:test/parallel/test_torch.py" \
        >"$work/parallel/test_torch.py" 2>/dev/null; then
  echo "horovod_suite.sh: no test/parallel/test_torch.py at $tag in $source_arg" >&2
  exit 2
fi

# torch 2.9 added torch.optim.Muon, which takes 2-D parameters only; three tests of this file
# (written for torch 1.x) build every Optimizer subclass on a model with 1-D biases. The one
# change made to the file is to leave Muon out beside the optimizers it already leaves out; the
# diff is checked to be exactly those lines.
cp "$work/parallel/test_torch.py" "$work/test_torch.orig.py"
sed -i 's/^\( *\)subclass != torch.optim.SparseAdam$/\1subclass != torch.optim.SparseAdam and\n\1subclass.__name__ != "Muon"/' \
  "$work/parallel/test_torch.py"
changed="$(diff "$work/test_torch.orig.py" "$work/parallel/test_torch.py" | grep -c '^>')"
if [ "$changed" != 6 ]; then
  echo "horovod_suite.sh: expected the Muon exclusion to change 3 places of test_torch.py, got $changed lines" >&2
  exit 2
fi

# The file imports `horovod.torch as hvd` and three helpers from Horovod's test/utils/common.py
# (which itself needs Horovod's runner, mock and cloudpickle); these stand in for both.
cat >"$work/shim/horovod/__init__.py" <<'PY'
from horotopo import __version__  # noqa: F401
PY
cat >"$work/shim/horovod/torch/__init__.py" <<'PY'
from horotopo.torch import *  # noqa: F401,F403
from horotopo.torch import __all__, __version__  # noqa: F401
PY
cat >"$work/utils/common.py" <<'PY'
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
PY

# After every test the ranks meet (through files: this runs on one host) and tell each other
# whether the test failed. A rank whose test failed stops horotopo at once, so that ranks still
# waiting in one of that test's collectives get an error instead of waiting forever; if the
# test failed anywhere, every rank stops horotopo, and the next test's hvd.init() starts all of
# them afresh, together. Without this, one rank leaving a test early leaves the ranks out of
# step for the rest of the file. Failures still count as failures.
cat >"$work/parallel/conftest.py" <<'PY'
import os
import sys
import time

import pytest

import horovod.torch as hvd

_RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
_SIZE = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
_STEPS = os.environ["HOROVOD_SUITE_STEPS"]
_WAIT_S = float(os.environ.get("HOROVOD_SUITE_STEP_WAIT_S", "120"))
_failed = set()
_step = [0]


def _stop():
    if hvd.is_initialized():
        hvd.shutdown()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _failed.add(item.nodeid)
        # The traceback at once, with its time, not only in the summary at the end of the run.
        sys.__stdout__.write(f"\n[rank {_RANK} {time.strftime('%H:%M:%S')}] {item.nodeid} "
                             f"failed in {report.when}:\n{report.longreprtext[-4000:]}\n")
        sys.__stdout__.flush()
        _stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    _step[0] += 1
    mine = os.path.join(_STEPS, f"{_step[0]}.{_RANK}")
    with open(mine + ".tmp", "w") as f:
        f.write("failed" if item.nodeid in _failed else "ok")
    os.replace(mine + ".tmp", mine)
    every = [os.path.join(_STEPS, f"{_step[0]}.{r}") for r in range(_SIZE)]
    deadline = time.monotonic() + _WAIT_S
    while not all(os.path.exists(p) for p in every):
        if time.monotonic() > deadline:
            print(f"\n[rank {_RANK}] other ranks did not finish {item.nodeid} within {_WAIT_S} s")
            _stop()
            return
        time.sleep(0.02)
    if any(open(p).read() == "failed" for p in every):
        _stop()
PY

# Every rank writes its own verbose log, read test by test as it goes, so that a run cut short
# still reports what it finished; a test that failed on any rank counts as failed.
cat >"$work/rank.sh" <<'SH'
#!/usr/bin/env bash
rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
out="$RESULTS/$RUN_ID.rank$rank"
exec "$PY" -u -m pytest -p no:cacheprovider -v --no-header -o console_output_style=classic \
  "$@" >"$out.log" 2>&1
SH
chmod +x "$work/rank.sh"
cat >"$work/summary.py" <<'PY'
import glob
import json
import re
import sys

prefix, record = sys.argv[1], json.loads(sys.argv[2])
line = re.compile(r"::(\w+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")
# A failure's traceback, printed at once by conftest.py, comes between the test's name and its
# verdict on the verbose line; these two lines name the test on their own.
failure = re.compile(r"^(?:FAILED|ERROR) \S+::(\w+)|^\[rank \d+ [\d:]+\] \S+::(\w+) failed in",
                     re.MULTILINE)
outcomes = {}
for path in sorted(glob.glob(prefix + ".rank*.log")):
    with open(path, errors="replace") as log:
        text = log.read()
    for name, word in line.findall(text):
        kind = {"PASSED": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}.get(word, "failed")
        if outcomes.get(name) != "failed":
            outcomes[name] = kind
    for names in failure.findall(text):
        outcomes[names[0] or names[1]] = "failed"
counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failed", "skipped")}
print(" ".join(f"{k} {v}" for k, v in counts.items()))
failed = sorted(name for name, kind in outcomes.items() if kind == "failed")
for name in failed:
    print("  FAILED", name)
record.update(counts, failed_tests=failed)
with open(sys.argv[3], "a") as out:
    out.write(json.dumps(record) + "\n")
sys.exit(1 if counts["failed"] else 0)
PY

PYTHONPATH="$root/benchmarks" "$py" -c "
import json, os, results
date, commit, load = results._STARTED
json.dump({'date': date.isoformat(), 'commit': commit, 'load': load}, open('$work/started.json', 'w'))
"
export PY="$py" RESULTS="$work/results" PYTHONPATH="$work/shim:$work/utils${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$bindir:$PATH"
bad=0
launch() {  # launch RUN_ID N TIMEOUT TARGET [PYTEST_ARGS...]
  local run_id="$1" n="$2" limit="$3" target="$4"; shift 4
  local start=$SECONDS status
  mkdir -p "$RESULTS/$run_id.steps"
  HOROVOD_SUITE_STEPS="$RESULTS/$run_id.steps" RUN_ID="$run_id" timeout -k 10 "$limit" "$mpiexec" -n "$n" "$work/rank.sh" "$@" \
    "$target" </dev/null >"$RESULTS/$run_id.mpiexec.log" 2>&1
  status=$?
  local summary outcome=ok
  if [ "$status" = 124 ] || [ "$status" = 137 ]; then outcome=timeout; fi
  summary="$("$py" "$work/summary.py" "$RESULTS/$run_id" \
    "{\"mode\": \"$mode\", \"ranks\": $n, \"run\": \"$run_id\", \"exit\": $status, \"outcome\": \"$outcome\", \"seconds\": $((SECONDS - start))}" \
    "$work/records.jsonl" 2>&1)"
  local sum_status=$?
  if [ "$status" = 124 ] || [ "$status" = 137 ]; then
    echo "[$run_id] TIMEOUT after ${limit} s: $summary"
    tail -n 5 "$RESULTS/$run_id".rank*.log | sed 's/^/    /'
    bad=$((bad + 1))
  elif [ "$status" != 0 ] && [ "$status" != 5 ] || [ "$sum_status" != 0 ]; then
    echo "[$run_id] exit $status in $((SECONDS - start)) s: $summary"
    tail -n 30 "$RESULTS/$run_id".rank*.log "$RESULTS/$run_id.mpiexec.log" | sed 's/^/    /'
    bad=$((bad + 1))
  else
    echo "[$run_id] ok in $((SECONDS - start)) s: $summary"
  fi
}

for n in $sizes; do
  case "$mode" in
    file)
      launch "file-n$n" "$n" "${HOROVOD_SUITE_TIMEOUT_S:-480}" "$work/parallel/test_torch.py" ;;
    each)
      tests="$(HOROVOD_SUITE_STEPS="$work" "$py" -m pytest -p no:cacheprovider -q \
                 --collect-only "$work/parallel/test_torch.py" 2>&1 | grep '::' |
               sed 's/.*:://' | grep -E "${HOROVOD_SUITE_ONLY:-.}")"
      if [ -z "$tests" ]; then
        echo "horovod_suite.sh: no test of test_torch.py to run (collection failed, or" \
             "HOROVOD_SUITE_ONLY matched none)" >&2
        exit 2
      fi
      for t in $tests; do
        launch "$t-n$n" "$n" "${HOROVOD_SUITE_TIMEOUT_S:-120}" \
          "$work/parallel/test_torch.py::TorchTests::$t"
      done ;;
    *)
      launch "k-n$n" "$n" "${HOROVOD_SUITE_TIMEOUT_S:-480}" "$work/parallel/test_torch.py" \
        -k "$mode" ;;
  esac
done
echo "[horovod_suite] $bad run(s) with failures or timeouts"
if [ -n "${HOROVOD_SUITE_MARKDOWN:-}" ]; then
  command="bash benchmarks/horovod_suite.sh HOROVOD_SOURCE \"$mode\" \"$sizes\""
  if [ "$mode" = each ] && [ -n "${HOROVOD_SUITE_ONLY:-}" ]; then
    command="HOROVOD_SUITE_ONLY='$HOROVOD_SUITE_ONLY' $command"
  fi
  PYTHONPATH="$root/benchmarks" "$py" - "$work/records.jsonl" "$HOROVOD_SUITE_MARKDOWN" \
    "$command" "$work/started.json" <<'PY'
import datetime
import json
import sys

import results

records_path, out_path, command, started_path = sys.argv[1:5]
with open(started_path) as f:
    started = json.load(f)
results._STARTED = (datetime.datetime.fromisoformat(started["date"]), started["commit"],
                    started["load"])
records = [json.loads(line) for line in open(records_path)]
lines = ["# horovod_suite: Horovod 0.28.1's test_torch.py against horotopo", "",
         "Generated by `benchmarks/horovod_suite.sh` (`HOROVOD_SUITE_MARKDOWN`); do not edit.",
         "", results.stamp(command), "",
         "A test counts as failed when it failed on any rank. \"each\" runs every test in its "
         "own mpiexec launch; \"file\" runs the whole file in one launch.", "",
         "| mode | ranks | launches | passed | failed | skipped | timed out | seconds | "
         "failed tests |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
groups = {}
for r in records:
    groups.setdefault((r["mode"], r["ranks"]), []).append(r)
for (mode, ranks), rs in groups.items():
    failed = sorted({t for r in rs for t in r["failed_tests"]} |
                    {r["run"] + " (timed out)" for r in rs if r["outcome"] == "timeout"})
    lines.append(f"| {mode} | {ranks} | {len(rs)} | {sum(r['passed'] for r in rs)} | "
                 f"{sum(r['failed'] for r in rs)} | {sum(r['skipped'] for r in rs)} | "
                 f"{sum(r['outcome'] == 'timeout' for r in rs)} | "
                 f"{sum(r['seconds'] for r in rs)} | {', '.join(failed) or '-'} |")
with open(out_path, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"[horovod_suite] wrote {out_path}")
PY
fi
exit "$bad"
