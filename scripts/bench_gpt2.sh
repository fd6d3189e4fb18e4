#!/usr/bin/env bash
# GPT-2 on one GPU, three contenders, the same model (124M: L12 NH12 C768; --model 774m: L36 NH20 C1280; --model
# 1558m: L48 NH25 C1600; vocabulary 50257, T 1024), bf16
# compute over fp32 master weights, random init, AdamW with clipping, the same tokens per optimizer step
# (global_batch x 1024, accumulated over global_batch / micro_batch micro-batches) and the same token file:
#   meshtrain  build/trainer --config configs/gpt2-MODEL.yaml, tokens/s from its run's metrics.jsonl, its GPU peak
#              from memory.json beside the planner's prediction for the same micro-batch (build/planner
#              --memory-only)
#   llm.c      train_gpt2cu built from .gpu-deps/llm.c (scripts/gpu_deps.sh), with cuDNN attention when cuDNN
#              and its frontend headers are found, tokens/s from its per-step "ms" lines
#   PyTorch    bench/gpt2_pytorch.py, eager and torch.compile, tokens/s from CUDA events
# Each number is the median over the steps after the warm-up. Usage:
#   scripts/bench_gpt2.sh [--model 124m|774m|1558m] [--build-dir DIR] [--out DIR] [--micro-batches "8 16 32"]
#                         [--global-batch 32]
#                         [--steps 40] [--warmup 10] [--contenders meshtrain,llmc,pytorch] [--prepare-only]
# --prepare-only builds llm.c and writes the token file, then stops (scripts/gpu_check.sh runs it during the
# meshtrain build). Environment: MT_BENCH_BUDGET_S (total seconds, default 400), MT_BENCH_COMPILE_MBS (the
# micro-batches PyTorch runs under torch.compile; default the largest), MT_PYTHON (the interpreter with
# PyTorch; default python3), MT_PEAK_TFLOPS (the card's dense bf16 peak, when the GPU's name is not one of
# those below), MT_NVCC, MT_CUDNN_INCLUDE_DIR, MT_CUDNN_LIBRARY (scripts/gpu_check.sh sets the last three).
#
# MFU, one formula for all three: model FLOPs per token = 6 N + 6 L T C, with N = 12 L C^2 + V C the weights
# that take part in matrix products (the blocks' four matrices and the tied LM head; V the true 50257), and
# 6 L T C the causal attention products (QK^T and AV: 12 L T C for full attention, half of it under the mask),
# forward and backward. For GPT-2 124M at T 1024 that is 797.8 MFLOP per token. MFU = tokens/s x FLOPs per
# token / the card's dense bf16 peak: H100 SXM and H200 989.4 TFLOP/s, H100 NVL 835, H100 PCIe 756.
#
# Output in --out (default $OUT if set, else <build dir>/gpu-report): bench.md (the Markdown table, also
# printed last) and bench.jsonl (one JSON object per contender and micro-batch), bench_MODEL.md and
# bench_MODEL.jsonl for --model 774m and 1558m; the runs themselves (logs, named after the model likewise,
# meshtrain's run dirs, llm.c's build) in <build dir>/bench-gpt2/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

BUILD=build
OUTDIR=${OUT:-}
MBS="8 16 32"
GB=32
STEPS=40
WARMUP=10
CONTENDERS=meshtrain,llmc,pytorch
PREPARE_ONLY=0
MODEL=124m
while (($#)); do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    --micro-batches) MBS="${2//,/ }"; shift 2 ;;
    --global-batch) GB="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --contenders) CONTENDERS="$2"; shift 2 ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "bench_gpt2: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$BUILD" = /* ]] || BUILD=$ROOT/$BUILD
[[ -n "$OUTDIR" ]] || OUTDIR=$BUILD/gpu-report
# The model's shape, llm.c's random-init depth (-e dL gives GPT-2's width for that depth) and peak learning rate.
case $MODEL in
  124m) L=12 NH=12 C=768 LR=6e-4 ;;
  774m) L=36 NH=20 C=1280 LR=2.5e-4 ;;
  1558m) L=48 NH=25 C=1600 LR=2.5e-4 ;;
  *) echo "bench_gpt2: --model is 124m, 774m or 1558m, got $MODEL" >&2; exit 2 ;;
esac
CONFIG=configs/gpt2-$MODEL.yaml
TAG=""  # the larger models' files carry their name: one report folder holds every model's table
[[ $MODEL == 124m ]] || TAG=_$MODEL
[[ "$OUTDIR" = /* ]] || OUTDIR=$ROOT/$OUTDIR
T=1024
PY=${MT_PYTHON:-python3}   # the interpreter with PyTorch and numpy
WORK=$BUILD/bench-gpt2
TOKENS=$WORK/tokens.bin
LLMC=$WORK/llm.c
mkdir -p "$WORK" "$OUTDIR"
START=$(date +%s)
DEADLINE=$((START + ${MT_BENCH_BUDGET_S:-400}))
say() { printf '[bench_gpt2 %4ds] %s\n' "$(($(date +%s) - START))" "$*"; }
has() { [[ ",$CONTENDERS," == *",$1,"* ]]; }
# cap SECONDS: the smaller of SECONDS and what the budget has left (at least 1).
cap() { local left=$((DEADLINE - $(date +%s))); ((left < $1)) && echo $((left > 1 ? left : 1)) || echo "$1"; }

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | xargs)
GPU_CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
if [[ -z "$GPU_NAME" ]]; then
  echo "bench_gpt2: no GPU (nvidia-smi lists none); the benchmark needs one" >&2
  exit 1
fi
say "GPU $GPU_NAME (sm_$GPU_CC); micro-batches $MBS, global batch $GB x $T tokens, $STEPS steps ($WARMUP warm-up)"

# ---- preparation: the token file and llm.c -----------------------------------------------------------------
prepare_tokens() {
  [[ -s "$TOKENS" ]] && return 0
  # tinyshakespeare's bytes (token ids 0-255 of the 50257), repeated to 4M tokens, in llm.c's format (256 int32
  # header: magic 20240520, version 1, count; uint16 tokens), which meshtrain reads too (data.source=tokens).
  "$PY" bench/gpt2_pytorch.py --write-tokens "$TOKENS" --from-text data/tinyshakespeare.txt --num-tokens 4194304
}
LLMC_VARIANT=""
build_llmc() {
  local src=$ROOT/.gpu-deps/llm.c nvcc=${MT_NVCC:-$(command -v nvcc)}
  if [[ ! -f "$src/train_gpt2.cu" ]]; then
    echo "no llm.c snapshot in .gpu-deps/llm.c (scripts/gpu_deps.sh makes it)"
    return 1
  fi
  [[ -n "$nvcc" ]] || { echo "no nvcc"; return 1; }
  if [[ -x "$LLMC/train_gpt2cu" && -f "$LLMC/variant" ]]; then LLMC_VARIANT=$(cat "$LLMC/variant"); return 0; fi
  rm -rf "$LLMC"
  cp -r "$src" "$LLMC"
  # CUDA 13 takes a cudaMemLocation where CUDA 12 took a device number (llm.c's managed-memory fallback).
  local cuda_major
  cuda_major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  if ((cuda_major >= 13)); then
    local old_call='cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)'
    local new_call='cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})'
    sed -i "s/$old_call/$new_call/" "$LLMC/llmc/cuda_utils.cuh"
  fi
  # Libraries the Makefile names as -lcudnn and -lnvidia-ml: the Python cuDNN package and the driver ship only
  # versioned files, so unversioned links go into a private folder on LIBRARY_PATH.
  local links=$LLMC/lib f
  mkdir -p "$links"
  f=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | sed -n 's/.*libnvidia-ml\.so\.1 .*=> \(.*\)/\1/p' | head -n 1)
  [[ -z "$f" ]] && f=$(find "$(dirname "$nvcc")/.." -path '*stubs/libnvidia-ml.so' 2>/dev/null | head -n 1)
  [[ -n "$f" ]] && ln -sf "$f" "$links/libnvidia-ml.so"
  local make_args=(train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 "NVCC=$nvcc")
  [[ -n "$GPU_CC" ]] && make_args+=("GPU_COMPUTE_CAPABILITY=$GPU_CC")
  local frontend=$ROOT/.gpu-deps/cudnn-frontend
  if [[ -n "${MT_CUDNN_INCLUDE_DIR:-}" && -n "${MT_CUDNN_LIBRARY:-}" && -d "$frontend/include" ]]; then
    ln -sf "$MT_CUDNN_LIBRARY" "$links/libcudnn.so"
    ln -sfn "$frontend" "$LLMC/cudnn-frontend"  # the Makefile accepts ./cudnn-frontend/include or ~/cudnn-frontend
    say "llm.c: building train_gpt2cu with cuDNN attention ($MT_CUDNN_LIBRARY)"
    if (cd "$LLMC" && CPATH="$MT_CUDNN_INCLUDE_DIR${CPATH:+:$CPATH}" \
        LIBRARY_PATH="$links${LIBRARY_PATH:+:$LIBRARY_PATH}" make "${make_args[@]}" USE_CUDNN=1); then
      echo "llm.c (cuDNN)" >"$LLMC/variant"
      LLMC_VARIANT="llm.c (cuDNN)"
      return 0
    fi
    say "llm.c: the cuDNN build failed; building without cuDNN"
    rm -rf "$LLMC/build"
  else
    say "llm.c: building train_gpt2cu without cuDNN (cuDNN headers/library or frontend not found)"
  fi
  (cd "$LLMC" && LIBRARY_PATH="$links${LIBRARY_PATH:+:$LIBRARY_PATH}" make "${make_args[@]}") || return 1
  echo "llm.c" >"$LLMC/variant"
  LLMC_VARIANT="llm.c"
}

if ! prepare_tokens; then
  echo "bench_gpt2: could not write the token file $TOKENS" >&2
  exit 1
fi
if has llmc; then
  t0=$(date +%s)
  if build_llmc >"$WORK/llmc_build.log" 2>&1; then
    LLMC_VARIANT=$(cat "$LLMC/variant")
    say "llm.c: $LLMC_VARIANT ready ($(($(date +%s) - t0)) s; log $WORK/llmc_build.log)"
  else
    say "llm.c: build failed (log $WORK/llmc_build.log):"
    tail -n 15 "$WORK/llmc_build.log"
  fi
fi
((PREPARE_ONLY)) && exit 0

# llm.c loads libcudnn.so.9 from the Python package's folder at run time.
if [[ -n "${MT_CUDNN_LIBRARY:-}" ]]; then
  LD_LIBRARY_PATH="$(dirname "$MT_CUDNN_LIBRARY")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
fi
RESULTS=$OUTDIR/bench$TAG.jsonl
: >"$RESULTS"
# result CONTENDER MB STATUS [TOKENS_PER_S STEP_MS LOSS]: one JSON line.
result() {
  python3 - "$@" >>"$RESULTS" <<'EOF'
import json, sys
c, mb, status = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = {"contender": c, "micro_batch": mb, "status": status}
if len(sys.argv) > 4:
    r.update(tokens_per_s=float(sys.argv[4]), step_ms=float(sys.argv[5]), loss=float(sys.argv[6]))
if len(sys.argv) > 8:  # meshtrain: its GPU peak (memory.json) and the planner's prediction, MiB
    r.update(peak_mib=float(sys.argv[7]), planner_mib=float(sys.argv[8]))
print(json.dumps(r))
EOF
}
run_status() {  # run_status EXIT_CODE LOG
  case $1 in
    124|137) echo "timed out" ;;
    0) echo "no step timings in its output ($(basename "$2"))" ;;
    *) echo "failed (exit $1): $(grep -v '^\s*$' "$2" | tail -n 1 | cut -c1-160)" ;;
  esac
}

# ---- llm.c -------------------------------------------------------------------------------------------------
if has llmc; then
  for mb in $MBS; do
    log=$WORK/llmc${TAG}_mb$mb.log
    if ((GB % mb)); then result llmc "$mb" "skipped: $GB does not divide by $mb"; continue; fi
    if [[ ! -x "$LLMC/train_gpt2cu" ]]; then result llmc "$mb" "not built"; continue; fi
    say "llm.c, micro-batch $mb"
    # -e dL: GPT-2 of depth L from random init; no validation after step 0 (-v), one validation batch (-m), no
    # sampling (-s 0); AdamW at the config's peak lr with 10 warm-up steps and weight decay 0.1, as the other two.
    (cd "$LLMC" && timeout -k 5 "$(cap 120)" ./train_gpt2cu -i "$TOKENS" -j "$TOKENS" -e "d$L" -b "$mb" -t $T \
      -d $((GB * T)) -x "$STEPS" -v 1000000 -m 1 -s 0 -l "$LR" -u 10 -c 0.1) >"$log" 2>&1
    rc=$?
    # "step    N/M | loss L (...)| norm ... | lr ... | MS ms | ... tok/s"
    read -r tps ms loss < <(python3 - "$log" "$WARMUP" "$GB" "$T" <<'EOF'
import re, statistics, sys
log, warmup, gb, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [(int(m.group(1)), float(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"step\s+(\d+)/\d+ \| loss ([0-9.naninf-]+) .*?\| ([0-9.]+) ms", open(log).read())]
kept = [r for r in rows if r[0] > warmup] or rows
if kept:
    ms = statistics.median(r[2] for r in kept)
    print(gb * t / (ms / 1000.0), ms, rows[-1][1])
EOF
    )
    if [[ -n "${tps:-}" ]] && ((rc == 0)); then
      result llmc "$mb" ok "$tps" "$ms" "$loss"
    else
      result llmc "$mb" "$(run_status "$rc" "$log")"
    fi
    tps=""
  done
fi

# ---- meshtrain ---------------------------------------------------------------------------------------------
if has meshtrain; then
  for mb in $MBS; do
    rd=$WORK/meshtrain${TAG}_mb$mb
    log=$WORK/meshtrain${TAG}_mb$mb.log
    if ((GB % mb)); then result meshtrain "$mb" "skipped: $GB does not divide by $mb"; continue; fi
    if [[ ! -x "$BUILD/trainer" ]]; then result meshtrain "$mb" "not built"; continue; fi
    say "meshtrain, micro-batch $mb"
    rm -rf "$rd"
    timeout -k 5 "$(cap 150)" "$BUILD/trainer" --config "$CONFIG" --set device=cuda \
      --set train.micro_batch="$mb" --set train.global_batch="$GB" --set train.steps="$STEPS" \
      --set data.source=tokens --set data.path="$TOKENS" --set run.dir="$rd" --set run.resume=none \
      >"$log" 2>&1
    rc=$?
    # The planner's predicted peak for this micro-batch (one rank, no ZeRO), for the measured one beside it.
    predicted=$("$BUILD/planner" --config "$CONFIG" --world 1 --memory-only --json --set device=cuda 2>/dev/null |
      python3 -c 'import json, sys
rows = [r for r in json.load(sys.stdin) if r["micro_batch"] == int(sys.argv[1]) and r["zero"] == 0]
print(rows[0]["memory_mb"] if rows else "")' "$mb" 2>/dev/null)
    read -r tps ms loss peak < <(python3 - "$rd/metrics.jsonl" "$WARMUP" "$rd/memory.json" <<'EOF'
import json, statistics, sys
path, warmup = sys.argv[1], int(sys.argv[2])
try:
    peak = max(r["peak_tensor_bytes"] for r in json.load(open(sys.argv[3]))["ranks"]) / 2**20
except (OSError, ValueError, KeyError):
    peak = float("nan")
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    sys.exit()
rows = [r for r in rows if "tokens_per_s" in r and r.get("tokens_per_s")]
kept = [r for r in rows if r["step"] > warmup] or rows
if kept:
    print(statistics.median(r["tokens_per_s"] for r in kept), statistics.median(r["step_ms"] for r in kept),
          rows[-1]["loss"] if rows[-1]["loss"] is not None else float("nan"), peak)
EOF
    )
    if [[ -n "${tps:-}" ]] && ((rc == 0)); then
      result meshtrain "$mb" ok "$tps" "$ms" "$loss" "$peak" "${predicted:-nan}"
    else
      result meshtrain "$mb" "$(run_status "$rc" "$log")"
    fi
    tps=""
  done
fi

# ---- PyTorch -----------------------------------------------------------------------------------------------
if has pytorch; then
  largest=$(tr ' ' '\n' <<<"$MBS" | grep . | sort -n | tail -n 1)
  compile_mbs=${MT_BENCH_COMPILE_MBS:-$largest}
  say "PyTorch: eager at micro-batches $MBS, torch.compile at ${compile_mbs}"
  pt_json=$WORK/pytorch.jsonl
  rm -f "$pt_json"
  PYTHONUNBUFFERED=1 timeout -k 5 "$(cap 300)" "$PY" bench/gpt2_pytorch.py --micro-batches "${MBS// /,}" \
    --global-batch "$GB" --steps "$STEPS" --warmup "$WARMUP" --data "$TOKENS" --json "$pt_json" \
    --compile-micro-batches "${compile_mbs// /,}" --n-layer "$L" --n-head "$NH" --d-model "$C" \
    >"$WORK/pytorch.log" 2>&1
  rc=$?
  if [[ -s "$pt_json" ]]; then
    cat "$pt_json" >>"$RESULTS"
  else
    result pytorch-eager "${MBS%% *}" "$(run_status "$rc" "$WORK/pytorch.log")"
  fi
  if ((rc != 0)); then
    say "PyTorch: exit $rc (log $WORK/pytorch.log)"
    tail -n 5 "$WORK/pytorch.log"
  fi
fi

# ---- the table ---------------------------------------------------------------------------------------------
python3 - "$RESULTS" "$GPU_NAME" "$GB" "$T" "$STEPS" "$WARMUP" "${LLMC_VARIANT:-llm.c}" "${MT_PEAK_TFLOPS:-}" \
  "$MODEL" "$L" "$C" >"$OUTDIR/bench$TAG.md" <<'EOF'
import json, math, sys
path, gpu, gb, t, steps, warmup, llmc_name, peak_env, model = sys.argv[1:10]
gb, t = int(gb), int(t)
L, C, V = int(sys.argv[10]), int(sys.argv[11]), 50257
N = 12 * L * C * C + V * C                      # weights in matrix products (tied LM head included)
flops_per_token = 6 * N + 6 * L * t * C         # + causal attention (QK^T, AV), forward and backward
def peak_tflops(name):
    if peak_env:
        return float(peak_env)
    n = name.upper()
    if "H100" in n and "PCIE" in n:
        return 756.0
    if "H100" in n and "NVL" in n:
        return 835.0
    if "H100" in n or "H200" in n or "H800" in n:
        return 989.4
    return None
peak = peak_tflops(gpu)
rows = [json.loads(l) for l in open(path) if l.strip()]
names = {"meshtrain": "meshtrain", "llmc": llmc_name, "pytorch-eager": "PyTorch eager",
         "pytorch-compile": "PyTorch torch.compile"}
base = {r["micro_batch"]: r["tokens_per_s"] for r in rows if r["contender"] == "llmc" and r["status"] == "ok"}
order = ["meshtrain", "llmc", "pytorch-eager", "pytorch-compile"]
rows.sort(key=lambda r: (order.index(r["contender"]) if r["contender"] in order else 9, r["micro_batch"]))
print(f"GPT-2 {model.upper()} (L{L} C{C} V{V}, T {t}), bf16, {gb} x {t} = {gb * t} tokens per optimizer step, on {gpu}; "
      f"median over steps {int(warmup) + 1}-{steps}. Ratio: tokens/s over llm.c's at the same micro-batch. "
      f"MFU: tokens/s x {flops_per_token / 1e6:.1f} MFLOP/token (6N + 6LTC, N = 12LC^2 + VC) over "
      + (f"{peak:g} TFLOP/s (dense bf16 peak)." if peak else "an unknown peak (set MT_PEAK_TFLOPS).")
      + " GPU peak: meshtrain's memory.json (peak tensor bytes), and in brackets build/planner's prediction.")
print()
print("| contender | micro-batch | tokens/s | ratio to llm.c | MFU | ms/step | loss (last step) | GPU peak MiB (planner) |")
print("|-----------|------------:|---------:|---------------:|----:|--------:|-----------------:|-----------------------:|")
for r in rows:
    name, mb = names.get(r["contender"], r["contender"]), r["micro_batch"]
    if r["status"] != "ok":
        print(f"| {name} | {mb} | {r['status'].replace('|', '/')} | | | | | |")
        continue
    tps = r["tokens_per_s"]
    ratio = f"{tps / base[mb]:.2f}" if mb in base else "n/a"
    mfu = f"{100 * tps * flops_per_token / (peak * 1e12):.1f}%" if peak else "n/a"
    loss = r.get("loss")
    loss = f"{loss:.3f}" if isinstance(loss, (int, float)) else ""
    mem = ""
    if not math.isnan(r.get("peak_mib", math.nan)):
        mem = f"{r['peak_mib']:,.0f}"
        if not math.isnan(r.get("planner_mib", math.nan)):
            mem += f" ({r['planner_mib']:,.0f}, {100 * (r['planner_mib'] / r['peak_mib'] - 1):+.1f}%)"
    print(f"| {name} | {mb} | {tps:,.0f} | {ratio} | {mfu} | {r['step_ms']:.1f} | {loss} | {mem} |")
best = {}
for r in rows:
    if r["status"] == "ok":
        best[r["contender"]] = max(best.get(r["contender"], 0), r["tokens_per_s"])
if best:
    print()
    ref = best.get("llmc")
    print("Best of each: " + "; ".join(
        f"{names.get(c, c)} {v:,.0f} tok/s" + (f" ({v / ref:.2f}x llm.c's best)" if ref and c != "llmc" else "")
        for c, v in sorted(best.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9)) + ".")
EOF
echo
cat "$OUTDIR/bench$TAG.md"
