#!/usr/bin/env bash
# The checks that need a GPU, run on a GPU machine after "GPU install" in docs/operators.md:
#   bash deploy/gpu_check.sh
# Prints one line per target, `gpu_check: <target>: PASS|FAIL|SKIP <detail>`, and exits 1 when a
# target failed, else 0:
#   cuda                    torch sees a CUDA device (the CUDA build of torch==2.13.0 is installed)
#   pytest-gpu              the tests marked `gpu` (pytest -m gpu); SKIP when none are collected
#   train-throughput-mfu    benchmarks/train_throughput.py, GPT-2 small, bf16, compiled, one GPU: the
#                           project's loop at >= 40 % model FLOPs utilisation
#   train-throughput-ratio  the same run: the loop at >= 0.95 of the bare PyTorch loop's tokens/s
#   optimizer-step          benchmarks/optimizer_step.py on the GPU: MERIT's step <= 1.5x AdamW(fused)'s
# (a benchmark target is SKIP when its script is absent, FAIL when it fails or prints no number)
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
  report cuda FAIL "$(last_line "$log_dir/cuda.log") (CUDA build of torch? docs/operators.md: GPU install)"
fi

# 2. the GPU-only tests
"$PYTHON" -m pytest -q -m gpu -p no:cacheprovider >"$log_dir/pytest.log" 2>&1
rc=$?
case $rc in
  0) report pytest-gpu PASS "$(last_line "$log_dir/pytest.log")" ;;
  5) report pytest-gpu SKIP "no tests marked gpu" ;;
  *) report pytest-gpu FAIL "exit $rc: $(last_line "$log_dir/pytest.log")" ;;
esac

# at_least VALUE MIN: whether VALUE (a number) >= MIN; a missing VALUE is not
at_least() { [ -n "$1" ] && awk -v v="$1" -v m="$2" 'BEGIN { exit !(v + 0 >= m + 0) }'; }
# judge TARGET VALUE OP LIMIT WHAT LOG: PASS when VALUE OP LIMIT (OP: >= or <=), FAIL naming the log's last line
judge() {
  if [ -z "$2" ]; then
    report "$1" FAIL "no $5 in the output: $(last_line "$6")"
  elif { [ "$3" = ">=" ] && at_least "$2" "$4"; } || { [ "$3" = "<=" ] && at_least "$4" "$2"; }; then
    report "$1" PASS "$5 $2 (target $3 $4)"
  else
    report "$1" FAIL "$5 $2 (target $3 $4)"
  fi
}

# 3. the training loop at the hardware's speed: GPT-2 small at seq_len 1024, bf16, compiled, on one GPU
bench=benchmarks/train_throughput.py
if [ -f "$bench" ]; then
  "$PYTHON" "$bench" --device cuda --preset gpt2-small --seq-len 1024 --batch-size 32 --max-micro-batch 16 \
    --precision bf16 --compile --steps 24 --warmup 6 --rounds 2 >"$log_dir/bench.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    # "loop (worker.loop.train, default metrics): 412,345 tokens/s, MFU 43.1%" and the last line
    # "loop / bare = 0.972 (target >= 0.95)"
    mfu=$(sed -n 's/^loop (.*MFU \([0-9.]*\)%.*/\1/p' "$log_dir/bench.log" | tail -n 1)
    ratio=$(sed -n 's/^loop \/ bare = \([0-9.]*\).*/\1/p' "$log_dir/bench.log" | tail -n 1)
    judge train-throughput-mfu "$mfu" ">=" 40 "MFU (%)" "$log_dir/bench.log"
    judge train-throughput-ratio "$ratio" ">=" 0.95 "loop / bare" "$log_dir/bench.log"
  else
    report train-throughput-mfu FAIL "exit $rc: $(last_line "$log_dir/bench.log")"
    report train-throughput-ratio FAIL "exit $rc: $(last_line "$log_dir/bench.log")"
  fi
else
  report train-throughput-mfu SKIP "$bench not present"
  report train-throughput-ratio SKIP "$bench not present"
fi

# 4. MERIT's step against torch's fused AdamW kernel on the GPU (GPT-2-small shapes)
bench=benchmarks/optimizer_step.py
if [ -f "$bench" ]; then
  "$PYTHON" "$bench" --device cuda --repeats 20 --warmup 3 --only "MERIT (eager)" "MERIT (compiled)" \
    >"$log_dir/optim.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    # "MERIT / AdamW(fused) = 1.23x (MERIT (compiled), MERIT's default on cuda; target <= 1.5x)"
    merit=$(sed -n 's/^MERIT \/ AdamW(fused) = \([0-9.]*\)x.*/\1/p' "$log_dir/optim.log" | tail -n 1)
    judge optimizer-step "$merit" "<=" 1.5 "MERIT / AdamW(fused)" "$log_dir/optim.log"
  else
    report optimizer-step FAIL "exit $rc: $(last_line "$log_dir/optim.log")"
  fi
else
  report optimizer-step SKIP "$bench not present"
fi

exit $failed
