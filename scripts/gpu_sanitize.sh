#!/usr/bin/env bash
# NVIDIA's compute sanitizers over meshtrain's GPU code (docs/cuda.md): memcheck (out-of-bounds and misaligned
# accesses, errors returned by CUDA calls), racecheck (shared-memory hazards inside a block) and initcheck
# (device memory read before anything wrote it), each over the GPU unit tests and a few steps of the trainer:
# GPT-2 in bf16 and fp32 and Llama in bf16 on one rank, and 2 ranks with ZeRO-2 or with context parallelism sharing
# the GPU over the MPI transport.
# Every run of every tool starts at once; each prints its line as it ends. gpu_check.sh's sanitize step runs it.
#
#   scripts/gpu_sanitize.sh BUILD_DIR LOG_DIR [TOOLS]     (TOOLS: comma-separated, default memcheck,racecheck,initcheck)
#
# Exit 0 when every run ended with "ERROR SUMMARY: 0 errors" and its program's own exit 0 (77, a skipped GPU
# test, counts as a failure here: the GPU is meant to be there); else 1. One line per run is printed.
set -uo pipefail
set -f   # the targets below are split into words, never globbed (Catch2 filters hold brackets)
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
if [[ -z "$SAN" ]]; then
  echo "gpu_sanitize: compute-sanitizer not found (PATH, beside nvcc, /usr/local/cuda)" >&2
  exit 1
fi
echo "gpu_sanitize: $SAN ($("$SAN" --version | sed -n 's/.*Version \(.*\)/\1/p' | head -n 1))"

RUN=/tmp/mt-sanitize
CAP=${MT_SANITIZE_CAP_S:-200}   # seconds for one run under one tool: a slow one fails alone
TRAIN=(--set device=cuda --set train.steps=2 --set run.log_every=1)
BF16="--set precision.compute=bf16"
DP2_ZERO2="--set comm.backend=mpi --set parallel.dp=2 --set optim.zero=2"
CP2="--set comm.backend=mpi --set parallel.cp=2"
# name|ranks|extra tool options|command. The unit tests' embedding, gelu and adamw cases are left out: their
# GPT-2-sized inputs take minutes under the tools, and the trainer steps below run those kernels.
# The communicator test's NCCL probes, while it initialises, for kernel images this GPU lacks and handles the
# errors itself (cudaErrorNoKernelImageForDevice from cudaFuncGetAttributes): API errors are not reported there.
TARGETS=(
  "kernels|1||$BUILD/tests/test_cuda_kernels ~[embedding]~[gelu]~[adamw]"
  "matmul_attention|1||$BUILD/tests/test_cuda_matmul_attention"
  "comm|1|--report-api-errors no|$BUILD/tests/test_cuda_comm"
  "gpt2_bf16|1||$BUILD/trainer --config configs/tiny.yaml ${TRAIN[*]} $BF16"
  "gpt2_fp32|1||$BUILD/trainer --config configs/tiny.yaml ${TRAIN[*]} --set precision.compute=fp32"
  "llama_bf16|1||$BUILD/trainer --config configs/llama-tiny.yaml ${TRAIN[*]} $BF16 --set train.recompute=selective"
  "dp2_zero2|2||$BUILD/trainer --config configs/tiny.yaml ${TRAIN[*]} $BF16 $DP2_ZERO2"
  "cp2|2||$BUILD/trainer --config configs/tiny.yaml ${TRAIN[*]} $BF16 $CP2"
  "matmul_fresh|1||$BUILD/tests/test_cuda_matmul_attention [fresh]"
)
# MT_SANITIZE_TARGETS: a regex of the target names to run (default all); MT_SANITIZE_OPTIONS: more options for
# every run (say --kernel-name-exclude kns=cudnn, to see what racecheck reports outside cuDNN's kernels).
TARGETS_RE=${MT_SANITIZE_TARGETS:-.}
EXTRA_OPTS=${MT_SANITIZE_OPTIONS:-}

one_run() {  # one_run TOOL TARGET: prints one line
  local tool=$1 name ranks opts cmd rc errs summaries kernels
  IFS='|' read -r name ranks opts cmd <<<"$2"
  local log=$LOGS/sanitize_${tool}_$name.log dir=$RUN/$tool/$name
  rm -rf "$dir" && mkdir -p "$dir"
  # shellcheck disable=SC2206  # word lists by design
  local san=(timeout -k 5 "$CAP" "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 200 $opts $EXTRA_OPTS)
  local args=($cmd)
  [[ $tool == racecheck ]] && san+=(--racecheck-report hazard)
  [[ ${args[0]} == */trainer ]] && args+=(--set "run.dir=$dir")
  if ((ranks > 1)); then
    mpiexec -n "$ranks" "${san[@]}" "${args[@]}" >"$log" 2>&1
  else
    "${san[@]}" "${args[@]}" >"$log" 2>&1
  fi
  rc=$?
  # One summary per process: "ERROR SUMMARY: N errors" (a second line may say how many were not printed), or
  # racecheck's "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
  local summary='(ERROR SUMMARY: [0-9]+ errors?$|RACECHECK SUMMARY: .*\([0-9]+ errors?,)'
  errs=$(grep -oE "$summary" "$log" | grep -oE '[0-9]+ error' | awk '{n += $1; seen = 1} END {if (seen) print n}')
  summaries=$(grep -cE "$summary" "$log")
  if ((rc == 0)) && ((summaries == ranks)) && [[ "${errs:-x}" == 0 ]]; then
    echo "  $tool $name: 0 errors"
    return 0
  fi
  ((rc == 124 || rc == 137)) && rc="$rc, timed out after $CAP s"
  # The kernels (or API calls) the reports name, most frequent first.
  kernels=$(grep -oE '(Device Frame: |at |on CUDA API call to )[A-Za-z_:<>0-9 ,()]*' "$log" |
    sed -E 's/^(Device Frame: |at )//' | cut -c1-90 | sort | uniq -c | sort -rn | head -n 4 |
    awk '{c=$1; $1=""; printf "%s%dx%s", (NR>1?";":""), c, $0}')
  echo "  $tool $name: FAILED (exit $rc, errors ${errs:-?}, $summaries of $ranks summaries;" \
    "${kernels:-no kernel named}; $log)"
  return 1
}

# Every (tool, target) pair at once: the tools' cost is mostly on the host, and the machine has many cores.
pids=()
for tool in ${TOOLS//,/ }; do
  for t in "${TARGETS[@]}"; do
    [[ ${t%%|*} =~ $TARGETS_RE ]] || continue
    one_run "$tool" "$t" &
    pids+=($!)
  done
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit "$failed"
