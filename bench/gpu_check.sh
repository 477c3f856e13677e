#!/usr/bin/env bash
# bench/gpu_check.sh — the prepared GPU check of cocoviz's CUDA target (issue 5).
#
#   bash bench/gpu_check.sh [--dry-run]        (from anywhere; it works in the repo root)
#
# Emits every sample × canonical schedule with --target cuda --arch sm_90 (both
# --collectives modes where they differ) at sizes that fit one GPU, builds them all
# (make, trees in parallel), runs each on ONE rank with --check --iters 20 --dump, compares
# the outputs with the numpy reference, compares packed (vectorized) kernels with an
# element-wise build, and times every kernel alone with Nsight Compute against the H200's
# ~4.8 TB/s of HBM (the fused schedules in both modes: the nccl-device kernel too). Each
# case runs again with --no-graph (calls launched from the host), for what the CUDA graph
# of the iteration saves. On one rank the collectives are trivial: the figures are
# kernels and GEMMs, not communication. Details: bench/gpu_check.py. --dry-run emits and
# builds only.
#
# Results: $OUT (the device tool's output folder) or ./gpu-check-out: summary.md,
# results.jsonl, kernels.csv, failures.log, gpu_check.log. Exit 0 when everything passed.
#
# Self-contained: installs nothing from the network. Python is, in order, $PYTHON, the
# repo's .venv, /work/venv, python3 — the first that imports jinja2, lark and numpy. With
# WHEELS=DIR, the wheels in DIR are installed first with `pip --no-index` into the work
# folder (e.g. lark and mpich for a machine without them; mpich also brings mpicxx and
# mpiexec). NCCL and cuBLAS come from the nvidia-* wheels of that Python (or NCCL_HOME,
# CUBLAS_HOME), CUDA from CUDA_HOME or nvcc on PATH, MPI from MPI_HOME, the Python's bin
# or PATH (cocoviz.emit.toolchain).
#
# Knobs: GPU_CHECK_BUDGET_S (default 420: no new work is started after it, so the whole
# script ends within ~8 minutes), GPU_CHECK_WORK (default /tmp/cocoviz-gpu-check),
# GPU_CHECK_JOBS (parallel compilers, default nproc), ARCH (default sm_90).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

DRY=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=(--dry-run) ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$arg' (expected --dry-run)" >&2; exit 2 ;;
  esac
done

OUTDIR=${OUT:-$ROOT/gpu-check-out}
WORK=${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/cocoviz-gpu-check}
mkdir -p "$OUTDIR" "$WORK" || exit 2

if [ -n "${WHEELS:-}" ]; then
  # --prefix, not --target: mpich's wheel installs bin/, include/ and lib/ as data files,
  # which --target drops (lib/); its mpicxx finds include/ and lib/ beside its bin/
  boot=${PYTHON:-python3}
  prefix=$WORK/prefix
  echo "gpu_check: installing $WHEELS/*.whl (no index) into $prefix" >&2
  "$boot" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --prefix "$prefix" "$WHEELS"/*.whl || { echo "gpu_check: wheel install failed" >&2; exit 2; }
  site=$("$boot" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "$prefix")
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$prefix/bin:$PATH"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

PY=
for cand in "${PYTHON:-}" "$ROOT/.venv/bin/python" /work/venv/bin/python python3; do
  [ -n "$cand" ] || continue
  command -v "$cand" >/dev/null 2>&1 || continue
  if "$cand" -c 'import jinja2, lark, numpy' >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  echo "gpu_check: no Python with jinja2, lark and numpy (set PYTHON, or WHEELS=DIR)" >&2
  exit 2
fi
echo "gpu_check: python $PY; output $OUTDIR; work $WORK" >&2

export PYTHONUNBUFFERED=1
exec "$PY" "$ROOT/bench/gpu_check.py" "${DRY[@]}" --out "$OUTDIR" --work "$WORK" \
  --budget "${GPU_CHECK_BUDGET_S:-420}" --jobs "${GPU_CHECK_JOBS:-$(nproc)}" --arch "${ARCH:-sm_90}"
