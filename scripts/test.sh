#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite: unit tests, gradient checks, the PyTorch
# parity test, convergence and every bad-input case. Extra arguments go to ctest (e.g. -R parity).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 "$@"
