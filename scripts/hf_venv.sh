#!/usr/bin/env bash
# The Python environment in which meshtrain's exports are loaded as their users load them: Hugging Face
# transformers from the Python package registry, on Debian's PyTorch (python3-torch, CPU). Creates it once, in a
# cache folder outside the checkout so every build and CI run on the machine reuses it, and prints its python.
# Used by tests/py/test_hf_export.py (which reports itself skipped when this fails); docs/llama.md.
#   scripts/hf_venv.sh            prints the venv's python, creating the venv first if it is missing
# Environment: MESHTRAIN_HF_VENV (the folder; default ${XDG_CACHE_HOME:-$HOME/.cache}/meshtrain/hf-venv),
# MESHTRAIN_HF_BASE_PYTHON (the interpreter whose torch is reused; default /usr/bin/python3).
# Exit status: 0 and the path on stdout; 1 and a message on stderr saying what is missing (no torch for the base
# python, no venv module, the registry unreachable or the install refused). It never waits on the network for
# long: each request times out after 30 s, with 2 retries, and the whole install is cut off after 10 minutes.
set -euo pipefail

# transformers 4.49 is the newest release that runs on PyTorch 1.13 (Debian 12's): 4.50 cannot import its models
# there (no torch.distributed.tensor) and later releases disable PyTorch below 2.x. It runs on torch 2.x too, so
# one pin serves both. Bump it together with the base interpreter's torch.
SPEC="transformers==4.49.0"
VENV="${MESHTRAIN_HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/meshtrain/hf-venv}"
BASE="${MESHTRAIN_HF_BASE_PYTHON:-/usr/bin/python3}"
# Newer transformers on an older torch import, but with PyTorch disabled: is_torch_available() says so.
CHECK="import torch, transformers; from transformers import GPT2LMHeadModel, LlamaForCausalLM
from transformers.utils import is_torch_available; assert is_torch_available(), 'transformers disabled PyTorch'"
# Cheap (no import of torch): the venv is finished and still finds both packages.
FOUND="import importlib.util as u, sys; sys.exit(not (u.find_spec('torch') and u.find_spec('transformers')))"

fail() { echo "hf_venv: $*" >&2; exit 1; }
ready() { [[ -f "$VENV/.meshtrain-spec" && "$(cat "$VENV/.meshtrain-spec")" == "$SPEC" ]] &&
          "$VENV/bin/python" -c "$FOUND" > /dev/null 2>&1; }

if ready; then echo "$VENV/bin/python"; exit 0; fi

[[ -x "$BASE" ]] || fail "no interpreter at $BASE (set MESHTRAIN_HF_BASE_PYTHON)"
"$BASE" -c "import torch" > /dev/null 2>&1 ||
  fail "$BASE cannot import torch: install Debian's python3-torch (scripts/setup.sh does)" \
       "or set MESHTRAIN_HF_BASE_PYTHON"

mkdir -p "$(dirname "$VENV")"
# One installer at a time (parallel ctest runs, two builds on one machine); the others wait for its venv.
exec 9> "$VENV.lock"
flock -w 900 9 || fail "timed out waiting for another install of $VENV (lock $VENV.lock)"
if ready; then echo "$VENV/bin/python"; exit 0; fi

# The marker file .meshtrain-spec is written last, so an interrupted install never looks finished (the next call
# starts it afresh).
rm -rf "$VENV"
# --system-site-packages: the venv sees Debian's torch and numpy (torch 1.13 is built against numpy 1.x; pip keeps
# the system numpy since it satisfies transformers). Debian's python3-venv supplies the venv's own pip; without
# it, Debian's python3-pip is used through the system site-packages.
if "$BASE" -m venv --system-site-packages "$VENV" > /dev/null 2>&1; then
  :
elif "$BASE" -c "import pip" > /dev/null 2>&1 && rm -rf "$VENV" &&
     "$BASE" -m venv --system-site-packages --without-pip "$VENV" > /dev/null 2>&1; then
  :
else
  fail "cannot create a virtual environment with $BASE: install Debian's python3-venv"
fi
echo "hf_venv: installing $SPEC into $VENV (once per machine)" >&2
LOG="$VENV/pip.log"
if ! timeout 600 "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input --progress-bar off \
       --timeout 30 --retries 2 "$SPEC" > "$LOG" 2>&1; then
  tail -n 15 "$LOG" >&2
  fail "pip could not install $SPEC from the Python package registry (see above)"
fi
"$VENV/bin/python" -c "$CHECK" >> "$LOG" 2>&1 || { tail -n 15 "$LOG" >&2; fail "$SPEC installed but does not import"; }
echo "$SPEC" > "$VENV/.meshtrain-spec"
echo "$VENV/bin/python"
