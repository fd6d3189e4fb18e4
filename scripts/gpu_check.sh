#!/usr/bin/env bash
# One command for a GPU machine (docs/cuda.md): builds meshtrain with CUDA, runs the GPU tests, the GPU parity
# tests, the GPT-2 124M benchmark and the whole test suite, and writes a Markdown report. The machine needs its
# own CUDA toolkit (nvcc), CMake, a C++ compiler, python3 with PyTorch and the Python packages nvidia-cudnn-* and
# nvidia-nccl-*, and the folder .gpu-deps/ made by scripts/gpu_deps.sh on a Debian 12 machine (nothing is
# downloaded here and nothing is installed into /).
#
#   scripts/gpu_check.sh [--steps LIST] [--skip LIST] [--budget SECONDS] [--build-dir DIR] [--report-dir DIR]
#                        [--tests REGEX] [--build-cap SECONDS]
#
# Steps, in the order they run (LIST: comma-separated names; default all):
#   deps        unpack .gpu-deps (the .deb files with dpkg-deb -x, or debian-deps.tar.xz) into a private prefix
#               ($MT_DEPS_PREFIX, default /tmp/mt-deps); MPICH's mpiexec/mpicc links made there
#   locate      nvcc, and cuDNN and NCCL (headers, libraries) from python3's nvidia.cudnn / nvidia.nccl packages
#               (else the CUDA toolkit's or the system's); LD_LIBRARY_PATH set for everything below
#   configure   cmake -G Ninja -DMESHTRAIN_CUDA=ON into the build dir (default build-cuda/), every dependency
#               pointed at the prefix
#   build       cmake --build -j<cores> (llm.c and the benchmark's token file are prepared meanwhile), at
#               most 420 s (--build-cap SECONDS)
#   cuda-tests  ctest -R cuda (--tests REGEX: the ctest tests matching REGEX instead)
#   py-tests    each tests/py/test_cuda_*.py, run as `python3 FILE BUILD_DIR`
#   sanitize    scripts/gpu_sanitize.sh: compute-sanitizer's memcheck, racecheck and initcheck over the GPU unit
#               tests and a few trainer steps (GPT-2, Llama, dp2 ZeRO-2), at most 240 s, in the background
#               beside the steps after it
#   bench       bench/bench_optimizer --device cuda (the optimizer step's calls merged against one per parameter,
#               into bench_optimizer.txt), then scripts/bench_gpt2.sh: meshtrain, llm.c and PyTorch on GPT-2 124M
#               (tokens/s, MFU); MT_BENCH_MODELS="124m 774m 1558m" runs the larger models too, each in its share
#               of the time, into bench_774m.md and bench_1558m.md
#   profile     scripts/gpu_profile.sh: GPU time by kernel of meshtrain's GPT-2 124M step (3 steps, micro-batch
#               16 of 16), and of llm.c's (its second step), into kernels_meshtrain.md and kernels_llmc.md
#   all-tests   the whole ctest suite, with the time that is left (ctest --stop-time); the tests whose names hold
#               "cuda" are left out when cuda-tests and py-tests ran them in the same run
# Without a GPU (nvidia-smi lists none) it runs deps, locate and configure only, says so, and exits 0.
# With one it exits 1 when a step it ran failed (a benchmark contender that fails is a row of the table, not a
# failed step), else 0.
#
# Report: in --report-dir, else $OUT if set, else <build dir>/gpu-report: report.md (device, each step's status
# and time, test counts, the benchmark table), bench.md and bench.jsonl (the benchmark), check.log (this
# script's whole output) and logs.tar.gz (every step's log; the benchmark's build log, run logs and meshtrain's
# metrics). The benchmark table is printed last.
# The whole run keeps within --budget seconds (default 570: the builds, tests and benchmark of a 16-core
# machine); each step gets at most its own cap and what is left.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

STEPS_ALL=(deps locate configure build cuda-tests py-tests sanitize bench profile all-tests)
WANT=",$(IFS=,; echo "${STEPS_ALL[*]}"),"
SKIP=","
BUDGET=${MT_GPU_CHECK_BUDGET_S:-570}
BUILD=${MT_GPU_BUILD_DIR:-build-cuda}
REPORT=${OUT:-}
TESTS_REGEX=cuda
BUILD_CAP=420   # the build step's own cap: a 16-core machine builds in a few minutes
while (($#)); do
  case "$1" in
    --steps) WANT=",$2,"; shift 2 ;;
    --skip) SKIP=",$2,"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --report-dir) REPORT="$2"; shift 2 ;;
    --tests) TESTS_REGEX="$2"; shift 2 ;;
    --build-cap) BUILD_CAP="$2"; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $BUDGET =~ ^[0-9]+$ && $BUILD_CAP =~ ^[0-9]+$ ]] || {
  echo "gpu_check: --budget and --build-cap take whole seconds" >&2
  exit 2
}
for s in ${WANT//,/ } ${SKIP//,/ }; do
  [[ " ${STEPS_ALL[*]} " == *" $s "* ]] || { echo "gpu_check: unknown step '$s' (steps: ${STEPS_ALL[*]})" >&2; exit 2; }
done
want() { [[ "$WANT" == *",$1,"* && "$SKIP" != *",$1,"* ]]; }

START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE=15                                    # seconds kept for the report at the end
JOBS=${MT_JOBS:-$(nproc)}
PREFIX=${MT_DEPS_PREFIX:-/tmp/mt-deps}
DEPS=$ROOT/.gpu-deps
[[ "$BUILD" = /* ]] || BUILD=$ROOT/$BUILD
[[ -n "$REPORT" ]] || REPORT=$BUILD/gpu-report
[[ "$REPORT" = /* ]] || REPORT=$ROOT/$REPORT
LOGS=$REPORT/logs
mkdir -p "$LOGS"
rm -f "$REPORT/report.md" "$REPORT"/bench*.md "$REPORT"/bench*.jsonl "$REPORT/logs.tar.gz"
exec > >(tee "$REPORT/check.log") 2>&1
TEE_PID=$!

say() { printf '[gpu_check %4ds] %s\n' "$(($(date +%s) - START))" "$*"; }

# ---- step bookkeeping --------------------------------------------------------------------------------------
STEP_NAMES=() STEP_STATUS=() STEP_SECS=() STEP_NOTES=()
FAILED=0
record() {  # record NAME STATUS SECONDS NOTE
  STEP_NAMES+=("$1") STEP_STATUS+=("$2") STEP_SECS+=("$3") STEP_NOTES+=("$4")
  say "$1: $2 (${3} s)${4:+ - $4}"
  [[ "$2" == failed || "$2" == "timed out" ]] && FAILED=1
  return 0
}
time_left() { echo $((DEADLINE - $(date +%s) - RESERVE)); }
# run_step NAME CAP_SECONDS COMMAND...: the command's output goes to logs/NAME.log; its status is recorded.
run_step() {
  local name="$1" cap="$2"
  shift 2
  local left t0 rc status
  left=$(time_left)
  if ((left < 20)); then record "$name" skipped 0 "out of time (budget ${BUDGET} s)"; return 1; fi
  ((cap > left)) && cap=$left
  t0=$(date +%s)
  say "$name: $* (at most ${cap} s; log logs/$name.log)"
  timeout -k 10 "$cap" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out" ;;
    *) status=failed ;;
  esac
  record "$name" "$status" $(($(date +%s) - t0)) "$([[ $rc != 0 ]] && echo "exit $rc")"
  if ((rc != 0)); then
    echo "---- last lines of logs/$name.log ----"
    tail -n 25 "$LOGS/$name.log"
    echo "----"
  fi
  return $rc
}

# ---- the machine -------------------------------------------------------------------------------------------
GPU_NAME="" GPU_DRIVER="" GPU_MEM="" SMI_CUDA=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  IFS=, read -r GPU_NAME GPU_DRIVER GPU_MEM < <(nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader | head -n 1)
  GPU_NAME=$(echo "$GPU_NAME" | xargs) GPU_DRIVER=$(echo "$GPU_DRIVER" | xargs) GPU_MEM=$(echo "$GPU_MEM" | xargs)
  SMI_CUDA=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
fi
HAVE_GPU=0
[[ -n "$GPU_NAME" ]] && HAVE_GPU=1
say "repository $ROOT, report $REPORT, build $BUILD, budget ${BUDGET} s, $JOBS cores"
if ((HAVE_GPU)); then
  say "GPU: $GPU_NAME, driver $GPU_DRIVER, $GPU_MEM, CUDA $SMI_CUDA (driver)"
else
  say "no GPU here (nvidia-smi lists none): checking the dependencies and the CMake configuration only"
fi

# ---- deps: unpack .gpu-deps into the prefix ----------------------------------------------------------------
ARCH_LIB=usr/lib/x86_64-linux-gnu
unpack_deps() {
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  local debs=("$DEPS"/debs/*.deb)
  if [[ -e "${debs[0]}" ]]; then
    for f in "${debs[@]}"; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$f" "$PREFIX" || return 1
      else  # a .deb is an ar archive holding data.tar.xz
        ar p "$f" "$(ar t "$f" | grep '^data\.tar')" | tar -xJ -C "$PREFIX" || return 1
      fi
    done
    echo "unpacked ${#debs[@]} .deb files into $PREFIX"
  elif [[ -f "$DEPS/debian-deps.tar.xz" ]]; then
    if command -v xz >/dev/null; then
      tar -C "$PREFIX" -xJf "$DEPS/debian-deps.tar.xz" || return 1
    else
      python3 -m tarfile -e "$DEPS/debian-deps.tar.xz" "$PREFIX" || return 1
    fi
    echo "unpacked $DEPS/debian-deps.tar.xz into $PREFIX"
  else
    echo "no .gpu-deps/debs/*.deb nor .gpu-deps/debian-deps.tar.xz: run scripts/gpu_deps.sh on a Debian 12" \
      "machine first, and bring .gpu-deps along" >&2
    return 1
  fi
  # update-alternatives makes MPICH's generic names and libopenblas.so.0 at install time; dpkg-deb -x does not.
  local bin=$PREFIX/usr/bin
  ln -sf mpiexec.hydra "$bin/mpiexec"
  ln -sf mpiexec.hydra "$bin/mpirun"
  ln -sf mpicc.mpich "$bin/mpicc"
  ln -sf mpicxx.mpich "$bin/mpicxx"
  # Run-time libraries: the machine's own copy of a library wherever it has one (ldconfig), this prefix's
  # only for the rest, through one folder of soname links on LD_LIBRARY_PATH ($MT_DEPS_ALL_LIBS=1: all of them).
  local rt=$PREFIX/runtime-lib cache f soname
  mkdir -p "$rt"
  cache=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null)
  # A library's soname is in its dynamic section (readelf), and is also the name of the package's link to it.
  while IFS= read -r f; do
    soname=""
    [[ -f "$f" && ! -L "$f" ]] && soname=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
    [[ -n "$soname" ]] || soname=$(basename "$f")
    if [[ "${MT_DEPS_ALL_LIBS:-0}" == 1 ]] || ! grep -q "^[[:space:]]*${soname//./\\.} (" <<<"$cache"; then
      ln -sf "$(readlink -f "$f")" "$rt/$soname"
    fi
  done < <(find "$PREFIX/$ARCH_LIB" "$PREFIX/lib" -maxdepth 2 \( -type f -o -type l \) -name 'lib*.so.*' \
    2>/dev/null | sort)
  # UCX (under libmpich) loads its transport modules from <its library's folder>/ucx.
  ln -sfn "$PREFIX/$ARCH_LIB/ucx" "$rt/ucx"
  echo "run-time libraries taken from the prefix: $(find "$rt" -mindepth 1 -maxdepth 1 -name 'lib*' -printf '%f ')"
  return 0
}
export_deps_env() {
  export PATH="$PREFIX/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$PREFIX/runtime-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export UCX_MODULE_DIR="$PREFIX/$ARCH_LIB/ucx"
  # hydra starts hydra_pmi_proxy from its own folder, then PATH; ranks run on this node only.
  export HYDRA_LAUNCHER=fork
}
if want deps; then
  t0=$(date +%s)
  if unpack_deps >"$LOGS/deps.log" 2>&1; then
    record deps ok $(($(date +%s) - t0)) "$(du -sh "$PREFIX" | cut -f1) in $PREFIX"
  else
    record deps failed $(($(date +%s) - t0)) "$(tail -n 1 "$LOGS/deps.log")"
  fi
  cat "$LOGS/deps.log"
else
  record deps skipped 0 "not asked for (using $PREFIX as it is)"
fi
export_deps_env

# ---- locate: nvcc, cuDNN and NCCL --------------------------------------------------------------------------
NVCC="" NCCL_INC="" NCCL_LIB="" CUDNN_INC="" CUDNN_LIB=""
locate_cuda() {
  NVCC=$(command -v nvcc || true)
  [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
  local cuda_root="" roots
  [[ -n "$NVCC" ]] && cuda_root=$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)
  # The Python packages' folders (namespace packages: nvidia.nccl.__path__, nvidia.cudnn.__path__).
  roots=$(python3 - <<'EOF' 2>/dev/null
import importlib
for name in ("nvidia.nccl", "nvidia.cudnn"):
    try:
        for p in importlib.import_module(name).__path__:
            print(name.split(".")[1], p)
    except Exception:
        pass
EOF
  )
  echo "python3 is $(command -v python3); its nvidia packages: ${roots:-none}"
  first() { find "$@" 2>/dev/null | sort | head -n 1; }
  local d nccl_dirs=() cudnn_dirs=()
  while read -r kind d; do
    [[ $kind == nccl ]] && nccl_dirs+=("$d")
    [[ $kind == cudnn ]] && cudnn_dirs+=("$d")
  done <<<"$roots"
  local fallback=()
  [[ -n "$cuda_root" ]] && fallback+=("$cuda_root/include" "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets")
  fallback+=(/usr/include /usr/lib/x86_64-linux-gnu)
  if ((${#nccl_dirs[@]})); then
    NCCL_INC=$(first "${nccl_dirs[@]}" -name nccl.h); NCCL_LIB=$(first "${nccl_dirs[@]}" -name 'libnccl.so*')
  fi
  [[ -z "$NCCL_INC" ]] && NCCL_INC=$(first "${fallback[@]}" -maxdepth 3 -name nccl.h)
  [[ -z "$NCCL_LIB" ]] && NCCL_LIB=$(first "${fallback[@]}" -maxdepth 3 -name 'libnccl.so*')
  if ((${#cudnn_dirs[@]})); then
    CUDNN_INC=$(first "${cudnn_dirs[@]}" -name cudnn.h); CUDNN_LIB=$(first "${cudnn_dirs[@]}" -name 'libcudnn.so*')
  fi
  [[ -z "$CUDNN_INC" ]] && CUDNN_INC=$(first "${fallback[@]}" -maxdepth 3 -name cudnn.h)
  [[ -z "$CUDNN_LIB" ]] && CUDNN_LIB=$(first "${fallback[@]}" -maxdepth 3 -name 'libcudnn.so*')
  [[ -n "$NCCL_INC" ]] && NCCL_INC=$(dirname "$NCCL_INC")
  [[ -n "$CUDNN_INC" ]] && CUDNN_INC=$(dirname "$CUDNN_INC")
  echo "nvcc:  ${NVCC:-not found}${NVCC:+ ($("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))}"
  echo "NCCL:  include ${NCCL_INC:-not found}, library ${NCCL_LIB:-not found}"
  echo "cuDNN: include ${CUDNN_INC:-not found}, library ${CUDNN_LIB:-not found}"
  # The build's other tools, so that a failed configure or llm.c build (it needs make) reads at a glance.
  local tool tools=""
  for tool in cmake ninja c++ make; do
    tools+=" $tool $( ("$tool" --version 2>/dev/null || echo 'not found') | head -n 1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?|not found' | head -n 1),"
  done
  echo "tools:${tools%,}"
  [[ -n "$NVCC" && -n "$NCCL_INC" && -n "$NCCL_LIB" ]]
}
if want locate; then
  t0=$(date +%s)
  if locate_cuda >"$LOGS/locate.log" 2>&1; then
    record locate ok $(($(date +%s) - t0)) ""
  else
    record locate failed $(($(date +%s) - t0)) "nvcc or NCCL not found"
  fi
  cat "$LOGS/locate.log"
fi
# Linked by full path; found at run time through LD_LIBRARY_PATH (their packages ship no libX.so link).
for lib in "$NCCL_LIB" "$CUDNN_LIB"; do
  [[ -n "$lib" ]] && LD_LIBRARY_PATH="$(dirname "$lib"):$LD_LIBRARY_PATH"
done
# The toolkit's cudart and cuBLASLt, for a build made elsewhere (a prebuilt --build-dir) where ldconfig lacks them.
if [[ -n "$NVCC" ]]; then
  for d in "$(dirname "$(readlink -f "$NVCC")")"/../lib64 "$(dirname "$(readlink -f "$NVCC")")"/../lib; do
    [[ -e "$d/libcublasLt.so.13" || -e "$d/libcublasLt.so.12" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(cd "$d" && pwd)"
  done
fi
export LD_LIBRARY_PATH
export MT_NVCC="$NVCC" MT_CUDNN_INCLUDE_DIR="$CUDNN_INC" MT_CUDNN_LIBRARY="$CUDNN_LIB"
[[ -n "$NVCC" ]] && PATH="$(dirname "$NVCC"):$PATH" && export PATH
# The same environment for commands run by hand after this script (the trainer, a benchmark): `. PREFIX/env.sh`.
[[ -d "$PREFIX" ]] && declare -p PATH LD_LIBRARY_PATH UCX_MODULE_DIR HYDRA_LAUNCHER MT_NVCC MT_CUDNN_INCLUDE_DIR \
  MT_CUDNN_LIBRARY 2>/dev/null |
  sed 's/^declare -x /export /' >"$PREFIX/env.sh"

# ---- configure and build -----------------------------------------------------------------------------------
GEN=(-G Ninja)
command -v ninja >/dev/null || GEN=()
CMAKE_ARGS=(
  -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_CUDA=ON
  -DCMAKE_PREFIX_PATH="$PREFIX/usr"
  -DCMAKE_LIBRARY_PATH="$PREFIX/$ARCH_LIB/openblas-pthread"
  -DEigen3_DIR="$PREFIX/usr/share/eigen3/cmake"
  -Dyaml-cpp_DIR="$PREFIX/$ARCH_LIB/cmake/yaml-cpp"
  -Dspdlog_DIR="$PREFIX/$ARCH_LIB/cmake/spdlog"
  -Dfmt_DIR="$PREFIX/$ARCH_LIB/cmake/fmt"
  -DCatch2_DIR="$PREFIX/usr/lib/cmake/Catch2"
  # MPICH without its compiler wrapper (mpicc.mpich names /usr paths): its header folder and library.
  -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_COMPILER=MPI_C_COMPILER-NOTFOUND
  -DMPI_C_HEADER_DIR="$PREFIX/usr/include/x86_64-linux-gnu/mpich"
  -DMPI_C_LIB_NAMES=mpich -DMPI_mpich_LIBRARY="$PREFIX/$ARCH_LIB/libmpich.so"
  -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpiexec"
  -DNCCL_INCLUDE_DIR="$NCCL_INC" -DNCCL_LIBRARY="$NCCL_LIB"
  # cuDNN (the Python package's) for the fused attention; the frontend headers come from .gpu-deps.
  -DCUDNN_INCLUDE_DIR="$CUDNN_INC" -DCUDNN_LIBRARY="$CUDNN_LIB"
  # The script tests run with this machine's python3 (its torch and numpy), not /usr/bin/python3.
  -DMESHTRAIN_PYTHON="$(command -v python3)"
)
[[ -n "$NVCC" ]] && CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC")
BUILD_OK=1   # 0 once configure or build has failed: the tests are then skipped, the benchmark runs without meshtrain
if want configure; then
  rm -f "$BUILD/CMakeCache.txt"
  # pkg-config sees only the prefix's files: CMake's FindMPI asks it for 'mpi-c' before the hints above, and a
  # machine with Open MPI's mpi-c.pc (Ubuntu's) would otherwise get Open MPI's headers and libmpi.
  run_step configure 240 env PKG_CONFIG_LIBDIR="$PREFIX/$ARCH_LIB/pkgconfig" PKG_CONFIG_PATH= \
    cmake "${CMAKE_ARGS[@]}" || BUILD_OK=0
  if [[ -f "$BUILD/CMakeCache.txt" ]]; then
    echo "dependencies as configured:"
    keys='MPI_C_LIB_NAMES|MPI_C_LINK_FLAGS|Eigen3_DIR|yaml-cpp_DIR|spdlog_DIR|fmt_DIR|Catch2_DIR|MPI_C_HEADER_DIR|MPI_mpich_LIBRARY|MPIEXEC_EXECUTABLE'
    keys+='|NCCL_INCLUDE_DIR|NCCL_LIBRARY|CUDNN_LIBRARY|CUDNN_FRONTEND_INCLUDE_DIR|BLAS_openblas_LIBRARY|CBLAS_INCLUDE_DIR|CMAKE_CUDA_COMPILER|CMAKE_CUDA_ARCHITECTURES'
    grep -E "^($keys):" \
      "$BUILD/CMakeCache.txt" | sed 's/^/  /'
  fi
fi

BENCH_PREP_PID=""
if ((HAVE_GPU)); then
  if want bench; then  # llm.c's build and the token file, while meshtrain builds
    say "bench: preparing llm.c and the token file in the background (log logs/bench_prepare.log)"
    prep_cap=$(time_left)
    ((prep_cap > 420)) && prep_cap=420
    timeout -k 10 "$prep_cap" scripts/bench_gpt2.sh --prepare-only --build-dir "$BUILD" --out "$REPORT" \
      >"$LOGS/bench_prepare.log" 2>&1 &
    BENCH_PREP_PID=$!
  fi
  if want build; then
    if ((BUILD_OK)); then
      run_step build "$BUILD_CAP" cmake --build "$BUILD" -j "$JOBS" || BUILD_OK=0
    else
      record build skipped 0 "configure failed"
    fi
  fi
else
  for s in build cuda-tests py-tests sanitize bench profile all-tests; do want "$s" && record "$s" skipped 0 "no GPU"; done
fi

# ---- tests -------------------------------------------------------------------------------------------------
# ctest_counts LOG: "P passed, F failed, S skipped, N not run of T" from ctest's per-test lines.
ctest_counts() {
  local log="$1" p f s n t
  p=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$log")
  f=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout)' "$log")
  s=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped' "$log")
  n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Not Run' "$log")
  t=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
  echo "$p passed, $f failed, $s skipped, $n not run, of ${t:-?}"
}
TEST_LINES=()
if ((HAVE_GPU && !BUILD_OK)); then
  for s in cuda-tests py-tests sanitize all-tests; do want "$s" && record "$s" skipped 0 "the build failed"; done
  WANT=${WANT//,cuda-tests,/,}
  WANT=${WANT//,py-tests,/,}
  WANT=${WANT//,sanitize,/,}
  WANT=${WANT//,all-tests,/,}
fi
# The sanitizers run beside the tests and the benchmark (their slowness is the instrumented host side; the
# machine's cores are many): started now, recorded when they end, before the report.
SAN_PID=""
if ((HAVE_GPU)) && want sanitize; then
  SAN_T0=$(date +%s)
  say "sanitize: scripts/gpu_sanitize.sh in the background (at most 240 s; log logs/sanitize.log)"
  (timeout -k 10 240 scripts/gpu_sanitize.sh "$BUILD" "$LOGS" >"$LOGS/sanitize.log" 2>&1; echo $? >"$LOGS/sanitize.rc") &
  SAN_PID=$!
fi
if ((HAVE_GPU)) && want cuda-tests; then
  # The ctest tests named cuda_* (cuda_parity, cuda_checkpoints, ...) are the tests/py/test_cuda_*.py scripts:
  # the py-tests step runs them.
  run_step cuda-tests 200 ctest --test-dir "$BUILD" -R "$TESTS_REGEX" -E "^cuda_" --output-on-failure --timeout 180 -j 4
  [[ -f "$LOGS/cuda-tests.log" ]] && TEST_LINES+=("ctest -R $TESTS_REGEX: $(ctest_counts "$LOGS/cuda-tests.log")")
fi
if ((HAVE_GPU)) && want py-tests; then
  shopt -s nullglob
  pyt=(tests/py/test_cuda_*.py)
  shopt -u nullglob
  if ((${#pyt[@]} == 0)); then
    record py-tests skipped 0 "no tests/py/test_cuda_*.py yet"
  else
    # The scripts at once, each in its own subshell (run_step's record there is lost: the parent records from the
    # exit codes); they share the GPU, and the CPU reference runs they make use the machine's other cores.
    pp=0 pf=0 pids=() t0=$(date +%s)
    say "py-tests: ${#pyt[@]} scripts at once (logs logs/py-NAME.log)"
    for f in "${pyt[@]}"; do
      (run_step "py-$(basename "$f" .py)" 240 env PYTHONUNBUFFERED=1 python3 "$f" "$BUILD" >/dev/null) &
      pids+=($!)
    done
    for i in "${!pyt[@]}"; do
      n=$(basename "${pyt[$i]}" .py)
      wait "${pids[$i]}"
      rc=$?
      if ((rc == 0)); then pp=$((pp + 1)); st=ok; else pf=$((pf + 1)); st=failed; fi
      record "py-$n" "$st" $(($(date +%s) - t0)) "$( ((rc != 0)) && echo "exit $rc")"
      if ((rc != 0)); then echo "---- last lines of logs/py-$n.log ----"; tail -n 25 "$LOGS/py-$n.log"; echo "----"; fi
    done
    TEST_LINES+=("tests/py/test_cuda_*.py: $pp passed, $pf failed, of ${#pyt[@]}")
  fi
fi

# ---- benchmark ---------------------------------------------------------------------------------------------
if ((HAVE_GPU)) && want bench; then
  if [[ -n "$BENCH_PREP_PID" ]]; then
    say "bench: waiting for the preparation (llm.c's build)"
    wait "$BENCH_PREP_PID"
    say "bench: preparation ended with exit $? (logs/bench_prepare.log)"
  fi
  # The optimizer step's kernel calls merged into runs against one call per parameter (bench/bench_optimizer.cpp).
  ((BUILD_OK)) && run_step bench-optimizer 60 bash -c "'$BUILD/bench/bench_optimizer' --device cuda \
    > '$REPORT/bench_optimizer.txt'"
  # Leave the whole suite at least 90 s when there is time for both.
  left=$(time_left)
  cap=$left
  want all-tests && ((left > 330)) && cap=$((left - 90))
  contenders=meshtrain,llmc,pytorch
  ((BUILD_OK)) || contenders=llmc,pytorch
  # MT_BENCH_MODELS: the models to benchmark, one bench_gpt2.sh run each with an equal share of the time
  # (default 124m; "124m 774m 1558m" for all three); MT_BENCH_ARGS: more arguments for each run.
  read -r -a models <<<"${MT_BENCH_MODELS:-124m}"
  share=$((cap / ${#models[@]}))
  for m in "${models[@]}"; do
    # shellcheck disable=SC2086  # MT_BENCH_ARGS is split into words on purpose
    run_step "bench-$m" "$share" env MT_BENCH_BUDGET_S="$((share - 10))" scripts/bench_gpt2.sh --build-dir "$BUILD" \
      --out "$REPORT" --model "$m" --contenders "$contenders" ${MT_BENCH_ARGS:-}
  done
fi
if ((HAVE_GPU)) && want profile; then
  if ((BUILD_OK)); then
    run_step profile-meshtrain 150 bash -c "scripts/gpu_profile.sh --steps 3 --csv '$LOGS/kernels_meshtrain.csv' -- \
      '$BUILD/trainer' --config configs/gpt2-124m.yaml --set train.steps=3 --set train.global_batch=16 \
      --set train.micro_batch=16 --set run.dir=/tmp/mt-profile --set run.log_every=1 > '$REPORT/kernels_meshtrain.md'"
  fi
  llmc=$BUILD/bench-gpt2/llm.c
  if scripts/bench_gpt2.sh --prepare-only --contenders llmc --build-dir "$BUILD" --out "$REPORT" \
      >"$LOGS/profile_prepare.log" 2>&1 && [[ -x "$llmc/train_gpt2cu" ]]; then
    run_step profile-llmc 120 bash -c "cd '$llmc' && '$ROOT/scripts/gpu_profile.sh' --steps 1 \
      --nvtx-range 'Train step 1' --csv '$LOGS/kernels_llmc.csv' -- ./train_gpt2cu -i ../tokens.bin -j ../tokens.bin \
      -e d12 -b 16 -t 1024 -d 16384 -x 2 -v 1000000 -m 1 -s 0 > '$REPORT/kernels_llmc.md'"
  else
    record profile-llmc skipped 0 "llm.c not built (logs/profile_prepare.log)"
  fi
fi
if ((HAVE_GPU)) && want all-tests; then
  left=$(time_left)
  if ((left >= 30)); then
    stop=$(date -d "@$((DEADLINE - RESERVE - 10))" +%H:%M:%S)
    # What cuda-tests and py-tests ran in this run is not run again: together the three steps are the suite.
    rest=()
    [[ "$TESTS_REGEX" == cuda ]] && want cuda-tests && want py-tests && rest=(-E cuda)
    run_step all-tests "$left" ctest --test-dir "$BUILD" --output-on-failure --timeout 150 "${rest[@]}" \
      -j "$((JOBS / 2 > 1 ? JOBS / 2 : 1))" --stop-time "$stop"
    [[ -f "$LOGS/all-tests.log" ]] && TEST_LINES+=("${rest:+the rest of }the ctest suite: $(ctest_counts "$LOGS/all-tests.log")")
  else
    record all-tests skipped 0 "out of time (budget ${BUDGET} s)"
  fi
fi

if [[ -n "$SAN_PID" ]]; then
  wait "$SAN_PID"
  rc=$(cat "$LOGS/sanitize.rc" 2>/dev/null || echo 1)
  case $rc in 0) st=ok ;; 124|137) st="timed out" ;; *) st=failed ;; esac
  record sanitize "$st" $(($(date +%s) - SAN_T0)) "$( ((rc != 0)) && echo "exit $rc")"
  cat "$LOGS/sanitize.log"
  TEST_LINES+=("compute-sanitizer: $(grep -c ': 0 errors$' "$LOGS/sanitize.log") runs clean, $(grep -c ': FAILED' \
    "$LOGS/sanitize.log") failed")
fi

# ---- report ------------------------------------------------------------------------------------------------
NVCC_VERSION=""
[[ -n "$NVCC" ]] && NVCC_VERSION=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p')
TORCH_VERSION=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable")
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "unknown")
DIRTY=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -vc '^??')
[[ "$DIRTY" == 0 ]] && DIRTY=""
# The ctest scripts that compare against PyTorch run /usr/bin/python3 (Debian's, with python3-torch).
SYS_TORCH=$(/usr/bin/python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null ||
  echo "no torch: the ctest scripts that use the PyTorch reference fail here")
{
  echo "# meshtrain GPU check"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT${DIRTY:+ ($DIRTY files modified)}," \
    "$(($(date +%s) - START)) s in all."
  echo
  echo "| | |"
  echo "|---|---|"
  if ((HAVE_GPU)); then
    echo "| device | $GPU_NAME, $GPU_MEM |"
    echo "| driver | $GPU_DRIVER (CUDA $SMI_CUDA) |"
  else
    echo "| device | none: no GPU on this machine (nvidia-smi lists none); build, tests and benchmark skipped |"
  fi
  echo "| nvcc | ${NVCC:-not found} ${NVCC_VERSION} |"
  echo "| NCCL | ${NCCL_LIB:-not found} |"
  echo "| cuDNN | ${CUDNN_LIB:-not found} |"
  echo "| PyTorch | $TORCH_VERSION ($(command -v python3)) |"
  echo "| /usr/bin/python3 | $SYS_TORCH |"
  echo "| host | $(uname -n), $(nproc) cores, $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}") |"
  echo
  echo "## Steps"
  echo
  echo "| step | status | seconds | note |"
  echo "|------|--------|--------:|------|"
  for i in "${!STEP_NAMES[@]}"; do
    echo "| ${STEP_NAMES[$i]} | ${STEP_STATUS[$i]} | ${STEP_SECS[$i]} | ${STEP_NOTES[$i]//|/\\|} |"
  done
  echo
  echo "## Tests"
  echo
  if ((${#TEST_LINES[@]})); then
    for l in "${TEST_LINES[@]}"; do echo "- $l"; done
    for lg in "$LOGS/cuda-tests.log" "$LOGS/all-tests.log"; do
      [[ -f "$lg" ]] || continue
      bad=$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout|Not Run)' "$lg" |
        sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: (.*[^ .]) *\.* *\*\*\*([A-Za-z]+( Run)?).*/\1 (\2)/' | head -n 40)
      if [[ -n "$bad" ]]; then
        echo
        echo "Not passed in $(basename "$lg" .log):"
        echo
        while IFS= read -r b; do echo "- $b"; done <<<"$bad"
      fi
    done
  else
    echo "No tests ran."
  fi
  echo
  echo "## Benchmark: GPT-2"
  echo
  tables=("$REPORT"/bench*.md)
  if [[ -f "${tables[0]}" ]]; then for t in "${tables[@]}"; do cat "$t"; echo; done; else echo "Not run."; fi
  echo
  echo "Logs: check.log (this run's output) and logs.tar.gz (each step's log, the benchmark's runs)."
} >"$REPORT/report.md"
if [[ -d "$BUILD/bench-gpt2" ]]; then  # the benchmark's own logs and meshtrain's metrics
  mkdir -p "$LOGS/bench"
  cp "$BUILD"/bench-gpt2/*.log "$BUILD"/bench-gpt2/*.jsonl "$LOGS/bench/" 2>/dev/null
  for m in "$BUILD"/bench-gpt2/meshtrain*_mb*/metrics.jsonl; do
    [[ -f "$m" ]] && cp "$m" "$LOGS/bench/$(basename "$(dirname "$m")")_metrics.jsonl"
  done
fi
tar -C "$REPORT" -czf "$REPORT/logs.tar.gz" logs 2>/dev/null && rm -rf "$LOGS"

echo
say "report: $REPORT/report.md"
if ((HAVE_GPU)); then
  for l in "${TEST_LINES[@]}"; do say "$l"; done
  for t in "$REPORT"/bench*.md; do [[ -f "$t" ]] && echo && cat "$t"; done
  status=$FAILED
else
  say "no GPU on this machine: the dependencies and the CMake configuration were checked" \
    "($( ((FAILED)) && echo "with failures: see the report" || echo ok)); the build, the GPU tests and the" \
    "benchmark need a GPU machine (docs/cuda.md)"
  status=0
fi
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit "$status"
