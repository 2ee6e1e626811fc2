#!/usr/bin/env bash
# One short check of calibrate/ on a lent GPU (budget: at most 8 minutes), or on the CPU.
#
#   calibrate/gpu_check.sh                 # CUDA: GPT-3 13B layer shape, 4 of 40 layers, bf16
#   calibrate/gpu_check.sh --device cpu    # the same steps on the tiny model and the ci grid
#
# Steps: the selective-batching correctness test on the device; a profile (times scaled
# from the profiled layers to the full depth); two fits (scaled: the cost model to commit;
# measured: the model of what actually ran); a replay of real serving against the
# simulation; one layer's kernels timed as a serving engine runs them (CUDA graphs), and
# eager. Everything lands in $OUT (the device tool's output folder) or results/gpu_check.
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
if [[ "${1:-}" == "--device" ]]; then DEVICE="$2"; fi
DEST="${OUT:-results/gpu_check}/$DEVICE"
PY="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
if [[ "$DEVICE" == "cuda" ]]; then
  MODEL=gpt3-13b LAYERS=4 GRID=default MAX_TOKENS=2048 SCENARIO=scenarios/calibrated/gpu_gpt3_13b.yaml
  REQUESTS=300 KERNEL_ARGS=""
else
  MODEL=tiny LAYERS=2 GRID=ci MAX_TOKENS=384 SCENARIO=scenarios/calibrated/cpu_tiny.yaml
  REQUESTS=12 KERNEL_ARGS="--max-tokens 64 --layers 1 --repeats 2"
fi
# On the GPU the whole selective-batching test; on the CPU, where the test suite runs that
# file already, one of its tests proves the step.
CORRECTNESS=tests/test_calibrate_model.py
if [[ "$DEVICE" != "cuda" ]]; then CORRECTNESS="$CORRECTNESS::test_mixed_batch"; fi
step() { STEP="$*"; echo "== $* ($(date -u +%H:%M:%S))"; }
# Each command runs under a limit of its own, so that a step that hangs (a wedged kernel, a
# replay that never drains) stops there and leaves the earlier steps' files, rather than
# eating the device budget of a lent machine: at most 475 s in all, under the 8 minutes.
# GPU_CHECK_LIMIT_SCALE multiplies every limit (a slower machine; a test sets it tiny).
SCALE="${GPU_CHECK_LIMIT_SCALE:-1}"
limited() {
  # At least 1 ms: `timeout 0` would be no limit at all.
  local limit_s; limit_s=$(awk -v a="$1" -v b="$SCALE" \
    'BEGIN { v = a * b; printf "%.3f", (v < 0.001 ? 0.001 : v) }')
  shift
  local rc=0
  timeout --kill-after=15 "$limit_s" "$@" || rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "error: step '$STEP' ran past its limit of $limit_s s (GPU_CHECK_LIMIT_SCALE=$SCALE);" \
         "the steps before it left their files in $DEST" >&2
  fi
  return $rc
}

# Before any step: every module the steps import (scipy only at the replay's overhead fit,
# matplotlib at its figure), Python 3.11+, and the device. A lent machine has no network and
# minutes of budget: a module found missing after the profile cost those minutes.
"$PY" - "$DEVICE" <<'PREFLIGHT' || exit 2
import importlib, sys
if sys.version_info < (3, 11):
    sys.exit(f"error: {sys.executable} is Python {sys.version.split()[0]}; expected 3.11 or later")
missing = []
for name in ("torch", "numpy", "pandas", "pydantic", "yaml", "scipy.optimize", "scipy.stats",
             "matplotlib", "pytest", "hypothesis", "calibrate.__main__", "calibrate.profile",
             "calibrate.replay", "calibrate.report", "calibrate.logs", "calibrate.layer_ops"):
    try:
        importlib.import_module(name)
    except Exception as e:  # an ImportError, or a module broken on import: said all at once
        missing.append(f"{name} ({type(e).__name__}: {e})")
if missing:
    sys.exit(f"error: {sys.executable} cannot import {'; '.join(missing)}; expected the "
             "calibrate and dev extras installed (no step was run)")
import torch
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit(f"error: --device cuda: torch {torch.__version__} sees no CUDA device (no step was run)")
PREFLIGHT
mkdir -p "$DEST"

step "correctness on $DEVICE"
limited 45 env CALIBRATE_TEST_DEVICE="$DEVICE" "$PY" -m pytest -q -p no:cacheprovider "$CORRECTNESS"
if [[ "$DEVICE" == "cuda" ]]; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$DEST/device.txt" || true; fi
# What ran where and when, for every file here (kernels.csv has no header of its own).
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "model: $MODEL"; echo "layers_profiled: $LAYERS"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  "$PY" -c 'import sys, torch; d = torch.cuda.get_device_name() if sys.argv[1] == "cuda" else "cpu"
print(f"python: {sys.version.split()[0]}\ntorch: {torch.__version__}\ndevice_name: {d}")' "$DEVICE"
} > "$DEST/provenance.txt"

step "profile $MODEL ($LAYERS layers) on $DEVICE, grid $GRID"
limited 180 "$PY" -m calibrate profile --model "$MODEL" --layers "$LAYERS" --device "$DEVICE" --grid "$GRID" \
  --max-tokens "$MAX_TOKENS" --out "$DEST/profile.csv" --force

step "fit"
limited 20 "$PY" -m calibrate fit "$DEST/profile.csv" --out "$DEST/cost_model.yaml" --force
limited 20 "$PY" -m calibrate fit "$DEST/profile.csv" --target measured_s --out "$DEST/cost_model_measured.yaml" --force

step "replay $SCENARIO"
limited 120 "$PY" -m calibrate replay "$SCENARIO" --model "$MODEL" --layers "$LAYERS" --device "$DEVICE" \
  --cost "$DEST/cost_model_measured.yaml" --load 0.55 --set "workload.num_requests=$REQUESTS" \
  --out "$DEST/replay" --force
step "kernels of $MODEL's layer on $DEVICE (CUDA graphs, then eager)"
limited 45 "$PY" -m calibrate kernels --model "$MODEL" --device "$DEVICE" $KERNEL_ARGS --out "$DEST/kernels.csv" --force
limited 45 "$PY" -m calibrate kernels --model "$MODEL" --device "$DEVICE" $KERNEL_ARGS --eager --out "$DEST/kernels_eager.csv" --force
step "done: $DEST"
