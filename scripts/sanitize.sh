#!/usr/bin/env bash
# Builds the unit tests with AddressSanitizer + UndefinedBehaviorSanitizer (g++, MESHTRAIN_SANITIZE=ON; any UB is
# fatal) into build-asan/ and runs them: every Catch2 test case on one rank (the ctest entries test_<file>:<case>)
# and the unit tests' short mpiexec runs on 2 to 8 ranks (test_comm_np*, mixed_precision_reducer_np*,
# mesh_split_np*, grad_compress_np*, test_hierarchical_np*, local_sgd_outer_np*, stale_gradients_np*,
# ring_attention_np*). The trainer's whole-program Python tests, and the GPU tests (tests/test_cuda_*.cpp), are left
# to scripts/test.sh.
# Needs the packages of scripts/setup.sh. Extra arguments go to ctest (e.g. -R test_config).
set -euo pipefail
cd "$(dirname "$0")/.."

B=build-asan
# Set before the build too (catch_discover_tests runs each executable to list its cases). halt_on_error: the
# first report fails the test; stack traces for UBSan reports too. Leak detection stays on, but MPI_Init's hwloc
# topology scan runs without its PCI plugin: that plugin (libpciaccess) leaks ~1 KB that LeakSanitizer reports as
# "<unknown module>" (the plugin is dlclose'd before the check, so no suppression file can name it); the tests
# need no PCI topology.
export HWLOC_COMPONENTS="${HWLOC_COMPONENTS:--pci}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p "$B"
targets=()
# Not the GPU tests (tests/test_cuda_*.cpp): this build has no CUDA backend, so they only report themselves skipped.
for f in tests/test_*.cpp; do [[ $f == tests/test_cuda_* ]] || targets+=("$(basename "$f" .cpp)"); done
# -O1 -g1 (the optimisation ASan's documentation recommends, and line tables for the reports' stack traces): the
# build takes 7 minutes on 2 cores instead of RelWithDebInfo's (-O2 -g) 15.5, and the tests take the same 60 s.
# A unity build (16 sources per compiler run: the library's headers parsed once per batch, not once per file) takes
# the library's part of the build from 9.2 to 5.5 CPU-minutes. Sources that define the same name in anonymous
# namespaces break it: such helpers belong in a shared header (kernels/kernel_checks.h, kernels/cpu/storage.h).
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16)
gen=(-G Ninja)  # as scripts/setup.sh: Ninja, unless an earlier build-asan/ has another generator
grep -qs '^CMAKE_GENERATOR:INTERNAL=' "$B/CMakeCache.txt" &&
  ! grep -qs '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$B/CMakeCache.txt" && gen=()
if ! { cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
         -DMESHTRAIN_SANITIZE=ON -DMESHTRAIN_CUDA=OFF "${unity[@]}" &&
       cmake --build "$B" -j2 --target "${targets[@]}"; } >"$B/build.log" 2>&1; then
  grep -E -A5 "error|Error" "$B/build.log" | head -80 >&2
  echo "sanitize: the build failed; the whole log is $B/build.log" >&2
  exit 1
fi
echo "sanitize: built ${#targets[@]} unit-test executables with ASan + UBSan"

UNIT='^(test_[A-Za-z0-9_]+:.*|test_comm_np[0-9]+|mixed_precision_reducer_np[0-9]+|mesh_split_np[0-9]+|grad_compress_np[0-9]+|test_hierarchical_np[0-9]+|local_sgd_outer_np[0-9]+|stale_gradients_np[0-9]+|ring_attention_np[0-9]+)$'
ctest --test-dir "$B" -R "$UNIT" --output-on-failure -j2 --timeout 900 "$@"
