#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into build-fuzz/ and runs each for
# SECONDS_PER_TARGET seconds (default 60), one after another.
#   Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# TARGET: config, safetensors, tokens, json, checkpoint_meta (default: all). Each run starts from the seeds in
# fuzz/corpus/<target>/ plus what earlier runs found (build-fuzz/corpus/<target>/, kept between runs); a crash,
# sanitizer report, leak, broken property, uncaught exception or an input slower than 10 s is saved to
# build-fuzz/artifacts/ and makes the script exit non-zero. Prints per target: executions, seconds, coverage
# (edges), features and corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(config safetensors tokens json checkpoint_meta)
# (libFuzzer reads -max_total_time=0 as "no limit", so 0 is refused.)
[[ "$SECONDS_PER_TARGET" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: SECONDS_PER_TARGET must be a positive whole number" >&2; exit 2; }

CXX_CLANG="${CLANG_CXX:-$(command -v clang++ || command -v clang++-14 || true)}"
CC_CLANG="${CLANG_CC:-$(command -v clang || command -v clang-14 || true)}"
[[ -n "$CXX_CLANG" && -n "$CC_CLANG" ]] || { echo "fuzz: clang/clang++ not found (apt-get install clang)" >&2; exit 1; }

B=build-fuzz
mkdir -p "$B"
if ! { cmake -S . -B "$B" -DMESHTRAIN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX_CLANG" \
         -DCMAKE_C_COMPILER="$CC_CLANG" && cmake --build "$B" -j2; } >"$B/build.log" 2>&1; then
  grep -E -A5 "error|Error" "$B/build.log" | head -60 >&2
  echo "fuzz: the build failed; the whole log is $B/build.log" >&2
  exit 1
fi

mkdir -p "$B/artifacts" "$B/logs"
# The targets write each input to a scratch file (the readers take paths): in memory when /dev/shm exists.
shm=/dev/shm
[[ -d $shm && -w $shm ]] || shm="${TMPDIR:-/tmp}"
export MT_FUZZ_SCRATCH
MT_FUZZ_SCRATCH=$(mktemp -d "$shm/meshtrain_fuzz.XXXXXX")
trap 'rm -rf "$MT_FUZZ_SCRATCH"' EXIT
failed=()
rows=()
for t in "${TARGETS[@]}"; do
  exe="$B/fuzz_$t"
  [[ -x "$exe" ]] || { echo "fuzz: no target '$t' (config, safetensors, tokens, json, checkpoint_meta)" >&2; exit 2; }
  mkdir -p "$B/corpus/$t"
  log="$B/logs/$t.log"
  dict=()
  [[ -f "fuzz/$t.dict" ]] && dict=(-dict="fuzz/$t.dict")
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s (log: $log)"
  start=$(date +%s)
  rc=0
  # New inputs go to the first corpus directory (build-fuzz/), never into the seeds under fuzz/.
  "$exe" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$B/artifacts/$t-" "${dict[@]}" "$B/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - start))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  [[ -z "$execs" ]] && execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  status=ok
  if ((rc != 0)); then
    status="CRASH (rc $rc)"
    failed+=("$t")
    echo "fuzz: $t failed; the end of its log:" >&2
    grep -v -E '^#[0-9]+' "$log" | tail -40 >&2
    ls "$B/artifacts/$t-"* 2>/dev/null | sed 's/^/fuzz: reproducer /' >&2 || true
  fi
  rows+=("$(printf '%-16s %12s %8s %8s %8s %14s  %s' "$t" "${execs:-?}" "$secs" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$status")")
done

echo
printf '%-16s %12s %8s %8s %8s %14s  %s\n' target executions seconds cov ft corpus status
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (reproduce: $B/fuzz_<target> <artifact>)" >&2
  exit 1
fi
