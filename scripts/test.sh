#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite: unit tests, gradient checks, the PyTorch
# parity test, convergence and every bad-input case. Extra arguments go to ctest (e.g. -R parity).
set -euo pipefail
cd "$(dirname "$0")/.."
# The one-time install of the Python environment hf_export loads the exports in (scripts/hf_venv.sh: transformers
# from the package registry, about 30 s, mostly waiting on the network) runs beside the build; the test waits for it
# (the script's lock) and reports itself skipped if it failed.
scripts/hf_venv.sh < /dev/null > /dev/null 2>&1 &
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 "$@"
