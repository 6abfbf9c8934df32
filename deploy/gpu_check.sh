#!/usr/bin/env bash
# The checks that need a GPU, run on a GPU machine after the README's "GPU install":
#   bash deploy/gpu_check.sh
# Prints one line per target, `gpu_check: <target>: PASS|FAIL|SKIP <detail>`, and exits 1 when a
# target failed, else 0:
#   cuda          torch sees a CUDA device (the CUDA build of torch==2.13.0 is installed)
#   pytest-gpu    the tests marked `gpu` (pytest -m gpu); SKIP when none are collected
#   train-throughput  benchmarks/train_throughput.py, when that script exists
# On a machine without a GPU it runs nothing: it says so and exits 0. A GPU is present when
# `nvidia-smi -L` lists one ($NVIDIA_SMI names another nvidia-smi; tests point it at a stand-in).
# $PYTHON is the interpreter (default .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."

NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
  echo "gpu_check: no GPU present ($NVIDIA_SMI not found); nothing to run"
  exit 0
fi
gpus=$("$NVIDIA_SMI" -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -eq 0 ]; then
  echo "gpu_check: no GPU present ($NVIDIA_SMI -L lists none); nothing to run"
  exit 0
fi

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
echo "gpu_check: $gpus GPU(s) found; python: $PYTHON"

failed=0
report() {  # target, status, detail
  echo "gpu_check: $1: $2 $3"
  if [ "$2" = FAIL ]; then failed=1; fi
}
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1; }
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

# 1. torch sees the GPU (a CPU build of torch would make every other target meaningless)
if "$PYTHON" -c 'import sys, torch; ok = torch.cuda.is_available(); print(f"torch {torch.__version__}, cuda {torch.version.cuda}, devices {torch.cuda.device_count()}"); sys.exit(0 if ok else 1)' >"$log_dir/cuda.log" 2>&1; then
  report cuda PASS "$(last_line "$log_dir/cuda.log")"
else
  report cuda FAIL "$(last_line "$log_dir/cuda.log") (CUDA build of torch? README: GPU install)"
fi

# 2. the GPU-only tests
"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider >"$log_dir/pytest.log" 2>&1
rc=$?
case $rc in
  0) report pytest-gpu PASS "$(last_line "$log_dir/pytest.log")" ;;
  5) report pytest-gpu SKIP "no tests marked gpu" ;;
  *) report pytest-gpu FAIL "exit $rc: $(last_line "$log_dir/pytest.log")" ;;
esac

# 3. the training-throughput benchmark, when the repository has it (it prints its ratio last)
bench=benchmarks/train_throughput.py
if [ -f "$bench" ]; then
  "$PYTHON" "$bench" >"$log_dir/bench.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    report train-throughput PASS "$(last_line "$log_dir/bench.log")"
  else
    report train-throughput FAIL "exit $rc: $(last_line "$log_dir/bench.log")"
  fi
else
  report train-throughput SKIP "$bench not present"
fi

exit $failed
