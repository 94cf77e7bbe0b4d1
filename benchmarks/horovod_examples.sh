#!/usr/bin/env bash
# Runs Horovod's own PyTorch examples with horotopo, changed in nothing but the import line.
#
#   bash benchmarks/horovod_examples.sh HOROVOD_CHECKOUT [PYTHON]
#
# HOROVOD_CHECKOUT: a git checkout of github.com/horovod/horovod (the v0.28.1 tag is read from it
# with `git show`, so any branch may be checked out); its examples are not on PyPI, and this
# repository does not carry them. PYTHON: an interpreter with horotopo, mpi4py, an MPI and the
# examples' own dependencies (pytorch_synthetic_benchmark.py needs torchvision, which does not
# install beside the CPU build of torch in .venv).
#
# Only examples that need no data download are run. Each is copied to a temporary folder, the one
# line `import horovod.torch as hvd` becomes `import horotopo.torch as hvd`, the copy is diffed
# against the original to prove that nothing else changed, and it runs under
# `horotopo-run -np 2` with arguments small enough for two CPU ranks. Exit status: the number of
# examples that failed.
set -uo pipefail
checkout="${1:?usage: horovod_examples.sh HOROVOD_CHECKOUT [PYTHON]}"
py="${2:-python}"
tag="${HOROVOD_TAG:-v0.28.1}"
bindir="$(dirname "$(command -v "$py")")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# name | example path at the tag | arguments (CPU, 2 ranks, a few batches)
examples=(
  "synthetic-resnet18|examples/pytorch/pytorch_synthetic_benchmark.py|--no-cuda --model resnet18 --batch-size 8 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2"
  "synthetic-fp16|examples/pytorch/pytorch_synthetic_benchmark.py|--no-cuda --model resnet18 --batch-size 8 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2 --fp16-allreduce"
  "synthetic-adasum|examples/pytorch/pytorch_synthetic_benchmark.py|--no-cuda --model resnet18 --batch-size 8 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2 --use-adasum"
)

failed=0
for entry in "${examples[@]}"; do
  IFS='|' read -r name path args <<<"$entry"
  original="$work/$name.orig.py"
  script="$work/$name.py"
  if ! git -C "$checkout" show "$tag:$path" >"$original"; then
    echo "[horovod_examples] $name: $path not found at $tag in $checkout" >&2
    failed=$((failed + 1)); continue
  fi
  sed 's/^import horovod\.torch as hvd$/import horotopo.torch as hvd/' "$original" >"$script"
  changed="$(diff "$original" "$script" | grep -c '^>')"
  if [ "$changed" != 1 ]; then
    echo "[horovod_examples] $name: expected exactly one changed line (the import), got $changed" >&2
    failed=$((failed + 1)); continue
  fi
  echo "=== $name: horotopo-run -np 2 $py $path $args"
  start=$(date +%s)
  # shellcheck disable=SC2086  # the arguments are meant to split
  if PATH="$bindir:$PATH" timeout 900 "$bindir/horotopo-run" -np 2 "$py" "$script" $args; then
    echo "=== $name: ok in $(( $(date +%s) - start )) s"
  else
    echo "=== $name: FAILED (exit $?) after $(( $(date +%s) - start )) s"
    failed=$((failed + 1))
  fi
done
echo "[horovod_examples] $(( ${#examples[@]} - failed )) of ${#examples[@]} examples ran" >&2
exit "$failed"
