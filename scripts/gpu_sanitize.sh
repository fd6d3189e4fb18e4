#!/usr/bin/env bash
# NVIDIA's compute sanitizers over meshtrain's GPU code (docs/cuda.md): memcheck (out-of-bounds and misaligned
# accesses, errors returned by CUDA calls), racecheck (shared-memory hazards inside a block) and initcheck
# (device memory read before anything wrote it), each over the GPU unit tests and a few steps of the trainer:
# GPT-2 and Llama in bf16 on one rank, and 2 ranks with ZeRO-2 sharing the GPU over the MPI transport.
# The three tools run at once, each over the targets in turn, printing a line per run as it ends.
# gpu_check.sh's sanitize step runs it.
#
#   scripts/gpu_sanitize.sh BUILD_DIR LOG_DIR [TOOLS]     (TOOLS: comma-separated, default memcheck,racecheck,initcheck)
#
# Exit 0 when every run ended with "ERROR SUMMARY: 0 errors" and its program's own exit 0 (77, a skipped GPU
# test, counts as a failure here: the GPU is meant to be there); else 1. One line per run is printed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:?usage: gpu_sanitize.sh BUILD_DIR LOG_DIR [TOOLS]}
LOGS=${2:?usage: gpu_sanitize.sh BUILD_DIR LOG_DIR [TOOLS]}
TOOLS=${3:-memcheck,racecheck,initcheck}
mkdir -p "$LOGS"
SAN=$(command -v compute-sanitizer || true)
if [[ -z "$SAN" ]]; then
  nvcc_dir=$(dirname "$(readlink -f "$(command -v nvcc)")" 2>/dev/null)
  for c in "$nvcc_dir/compute-sanitizer" "$nvcc_dir/../compute-sanitizer/compute-sanitizer" \
      /usr/local/cuda/bin/compute-sanitizer; do
    [[ -x "$c" ]] && SAN=$c && break
  done
fi
[[ -n "$SAN" ]] || { echo "gpu_sanitize: compute-sanitizer not found (PATH, beside nvcc, /usr/local/cuda)" >&2; exit 1; }
echo "gpu_sanitize: $SAN ($("$SAN" --version | sed -n 's/.*Version \(.*\)/\1/p' | head -n 1))"

RUN=/tmp/mt-sanitize
CAP=${MT_SANITIZE_CAP_S:-150}   # seconds for one run under one tool: a slow one fails alone, and the lines before it stay
TRAIN_STEPS=(--set device=cuda --set precision.compute=bf16 --set train.steps=2 --set run.log_every=1)
# name|ranks|command (ranks 1: run directly; 2: under mpiexec, each rank under the tool)
TARGETS=(
  "kernels|1|$BUILD/tests/test_cuda_kernels"
  "matmul_attention|1|$BUILD/tests/test_cuda_matmul_attention"
  "comm|1|$BUILD/tests/test_cuda_comm"
  "gpt2|1|$BUILD/trainer --config configs/tiny.yaml ${TRAIN_STEPS[*]}"
  "llama|1|$BUILD/trainer --config configs/llama-tiny.yaml ${TRAIN_STEPS[*]} --set train.recompute=selective"
  "dp2_zero2|2|$BUILD/trainer --config configs/tiny.yaml ${TRAIN_STEPS[*]} --set comm.backend=mpi --set parallel.dp=2 --set optim.zero=2"
)

one_tool() {  # one_tool TOOL: every target in turn; prints one line per target; returns the failures
  local tool=$1 bad=0 name ranks cmd log rc errs
  for t in "${TARGETS[@]}"; do
    IFS='|' read -r name ranks cmd <<<"$t"
    log=$LOGS/sanitize_${tool}_$name.log
    local dir=$RUN/$tool/$name
    rm -rf "$dir" && mkdir -p "$dir"
    local san=(timeout -k 5 "$CAP" "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 20)
    [[ $tool == racecheck ]] && san+=(--racecheck-report hazard)
    # shellcheck disable=SC2086  # cmd is a word list by design
    if ((ranks > 1)); then
      mpiexec -n "$ranks" "${san[@]}" $cmd --set run.dir="$dir" >"$log" 2>&1
    elif [[ $name == gpt2 || $name == llama ]]; then
      "${san[@]}" $cmd --set run.dir="$dir" >"$log" 2>&1
    else
      "${san[@]}" $cmd >"$log" 2>&1
    fi
    rc=$?
    errs=$(awk '/ERROR SUMMARY:/ {n += $(NF - 1) + 0; seen = 1} END {if (seen) print n}' "$log")
    local summaries
    summaries=$(grep -c 'ERROR SUMMARY' "$log")
    if ((rc == 0)) && ((summaries == ranks)) && [[ "${errs:-x}" == 0 ]]; then
      echo "  $tool $name: 0 errors"
    else
      ((rc == 124 || rc == 137)) && rc="$rc, timed out after $CAP s"
      echo "  $tool $name: FAILED (exit $rc, errors ${errs:-?}, $summaries of $ranks summaries; $log)"
      bad=$((bad + 1))
    fi
  done
  return "$bad"
}

pids=()
for tool in ${TOOLS//,/ }; do
  one_tool "$tool" &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit "$failed"
