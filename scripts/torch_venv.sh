#!/usr/bin/env bash
# A current PyTorch from the Python package registry, the speed baseline users would pick instead of meshtrain
# on a CPU (bench/bench_vs_pytorch.py measures it beside Debian's PyTorch 1.13, which stays the parity reference).
# Creates the venv once, in a cache folder outside the checkout, and prints its python. The registry's Linux wheel
# is the CUDA build (the CPU-only index is another host): about 5 GiB with its CUDA libraries, which a CPU run
# loads but never uses.
#   scripts/torch_venv.sh        prints the venv's python, creating the venv first if it is missing
# Environment: MESHTRAIN_TORCH_VENV (the folder; default ${XDG_CACHE_HOME:-$HOME/.cache}/meshtrain/torch-venv),
# MESHTRAIN_TORCH_SPEC (the pip requirement; default torch).
# Exit status: 0 and the path on stdout; 1 and a message on stderr (no venv module, the registry unreachable or
# the install refused). The install is cut off after 20 minutes.
set -euo pipefail

SPEC="${MESHTRAIN_TORCH_SPEC:-torch}"
VENV="${MESHTRAIN_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/meshtrain/torch-venv}"
BASE=/usr/bin/python3

fail() { echo "torch_venv: $*" >&2; exit 1; }
ready() { [[ -f "$VENV/.meshtrain-spec" && "$(cat "$VENV/.meshtrain-spec")" == "$SPEC" ]]; }

if ready; then echo "$VENV/bin/python"; exit 0; fi
mkdir -p "$(dirname "$VENV")"
exec 9> "$VENV.lock"
flock -w 1200 9 || fail "timed out waiting for another install of $VENV (lock $VENV.lock)"
if ready; then echo "$VENV/bin/python"; exit 0; fi

# The marker is written last, so an interrupted install never looks finished.
rm -rf "$VENV"
"$BASE" -m venv "$VENV" > /dev/null 2>&1 || fail "cannot create a virtual environment with $BASE: install python3-venv"
echo "torch_venv: installing $SPEC into $VENV (once per machine, ~5 GiB)" >&2
LOG="$VENV/pip.log"
if ! timeout 1200 "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off \
       --timeout 30 --retries 2 "$SPEC" numpy > "$LOG" 2>&1; then
  tail -n 15 "$LOG" >&2
  fail "pip could not install $SPEC from the Python package registry (see above)"
fi
"$VENV/bin/python" -c "import torch" >> "$LOG" 2>&1 || { tail -n 15 "$LOG" >&2; fail "$SPEC installed but does not import"; }
echo "$SPEC" > "$VENV/.meshtrain-spec"
echo "$VENV/bin/python"
