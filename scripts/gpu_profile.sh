#!/usr/bin/env bash
# A training step's GPU time by kernel: runs a command under Nsight Compute (ncu) with one metric, each kernel's
# duration (gpu__time_duration.sum), and prints the kernels grouped by name, longest total first, with their
# share of all kernel time and the time per step. Kernels run one at a time under ncu and with warm caches
# (--cache-control none), so each duration is the kernel's own; the sum leaves out the gaps between kernels.
#   scripts/gpu_profile.sh --steps N --csv FILE [--top K] [--nvtx-range NAME] -- COMMAND...
# --steps: how many training steps the profiled kernels belong to (the table divides by it); --csv: where ncu's raw
# table goes (a second run of the summary alone: --csv FILE --steps N with no command); --nvtx-range: profile only
# the kernels inside NVTX push/pop ranges of that name (llm.c names each step "Train step N"). Example, 3 steps of GPT-2 124M:
#   scripts/gpu_profile.sh --steps 3 --csv /tmp/k.csv -- build/trainer --config configs/gpt2-124m.yaml \
#     --set train.steps=3 --set train.global_batch=16 --set train.micro_batch=16
set -uo pipefail
STEPS=1 CSV="" TOP=40 NVTX=()
while (($#)); do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --csv) CSV="$2"; shift 2 ;;
    --top) TOP="$2"; shift 2 ;;
    --nvtx-range) NVTX=(--nvtx --nvtx-include "$2/"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_profile: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$CSV" ]] || { echo "gpu_profile: --csv FILE is required" >&2; exit 2; }
if (($#)); then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  [[ -n "$NCU" ]] || { echo "gpu_profile: ncu (Nsight Compute) not found" >&2; exit 2; }
  # --clock-control none: the card's clocks as they are (ncu would otherwise lock them to base clocks).
  "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
    "${NVTX[@]}" --log-file "$CSV" "$@" || { echo "gpu_profile: the profiled command failed" >&2; exit 1; }
fi
python3 - "$CSV" "$STEPS" "$TOP" <<'EOF'
import collections, csv, re, sys
path, steps, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [l for l in open(path, errors="replace") if l.startswith('"')]   # ncu's own messages start with ==
rows = list(csv.reader(lines))
if len(rows) < 3:
    sys.exit(f"gpu_profile: no kernel rows in {path}")
head, units = rows[0], rows[1]
name_col, time_col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}[units[time_col]]
def short(name):
    # "void ns::(anonymous namespace)::kernel<T, 8>(args)" -> "kernel<T, 8>"; library kernels keep their names.
    name = re.sub(r"\(.*\)$", "", name.replace("(anonymous namespace)::", "")).removeprefix("void ").strip()
    base = name.split("<")[0].split("::")[-1]
    tmpl = name[len(name.split("<")[0]):]
    return (base + tmpl)[:110]
total, count = collections.Counter(), collections.Counter()
for r in rows[2:]:
    ms = float(r[time_col].replace(",", "")) * scale
    total[short(r[name_col])] += ms
    count[short(r[name_col])] += 1
all_ms = sum(total.values())
print(f"{sum(count.values())} kernels, {all_ms:.2f} ms of kernel time in all, {all_ms / steps:.2f} ms per step "
      f"({steps} steps)")
print(f"| kernel | launches/step | ms/step | share |")
print(f"|---|--:|--:|--:|")
for k, ms in total.most_common(top):
    print(f"| {k} | {count[k] / steps:g} | {ms / steps:.3f} | {100 * ms / all_ms:.1f}% |")
rest = all_ms - sum(ms for _, ms in total.most_common(top))
if rest > 0:
    print(f"| (the other {len(total) - top} kernels) | | {rest / steps:.3f} | {100 * rest / all_ms:.1f}% |")
EOF
