"""Tests that need packages from the Python package registry (transformers, tokenizers) run under
scripts/hf_venv.sh's venv: a test whose interpreter lacks them runs itself again under the venv's python, made on the
first run and reused after; where it cannot be had (no network, no torch for the base interpreter, no venv module)
the test says why and exits 77, which CTest reports as skipped."""
import os
import subprocess
import sys
import time

SKIP = 77
CHILD = "MESHTRAIN_HF_VENV_CHILD"  # set when a script runs again under the venv's interpreter


def rerun_in_hf_venv_or_skip(src, why):
    """Replaces this process with the calling script under the venv's python (same arguments); exits 77 when the
    venv cannot be had, or when this already is the venv's run."""
    if os.environ.get(CHILD):
        print(f"SKIP: {why}; remove the venv to have scripts/hf_venv.sh build it again")
        sys.exit(SKIP)
    t0 = time.time()
    try:
        r = subprocess.run(["bash", os.path.join(src, "scripts", "hf_venv.sh")], capture_output=True, text=True,
                           timeout=1200)
    except subprocess.TimeoutExpired:
        print(f"SKIP: {why}, and scripts/hf_venv.sh did not finish within 1200 s")
        sys.exit(SKIP)
    if r.returncode != 0:
        print(r.stderr.rstrip())
        print(f"SKIP: {why}, and scripts/hf_venv.sh could not provide them (exit {r.returncode})")
        sys.exit(SKIP)
    if r.stderr.strip():
        print(r.stderr.rstrip())
        print(f"scripts/hf_venv.sh: {time.time() - t0:.1f} s")
    py = r.stdout.strip().splitlines()[-1]
    sys.stdout.flush()
    os.execve(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:], dict(os.environ, **{CHILD: "1"}))
