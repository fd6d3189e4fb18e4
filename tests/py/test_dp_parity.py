"""Data parallelism reproduces the single-rank run: dp = 2 and 4, 1 to 4 micro-batches per rank, overlap on and
off, ZeRO-1 on and off, small buckets (so reductions start during the backward pass), on both host transports
(comm.backend auto = shared memory, and mpi). Every step's loss must be within 1e-5 relative of the single-rank
run over 20 steps; with dp = 2 the two transports must agree bit for bit (a sum of two is the same either way).

Why 1e-5: the runs differ only in summation order (per-rank partial sums of the loss and the gradients, then an
average over dp), which moves fp32 results by ~1e-7 relative per step; AdamW over 20 steps amplifies that by
at most ~10x. A real bug (a bucket reduced twice or not at all, a wrong shard, a wrong loss scale) shows at the
first step as an O(1e-2) or larger difference. Standard library only.
Usage: test_dp_parity.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import re
import subprocess
import sys

mpiexec, trainer, src, work = sys.argv[1:5]
RTOL = 1e-5
BASE = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "train.global_batch=24",
        "--set", "train.steps=20", "--set", "comm.bucket_mb=0.004", "--set", "run.log_every=100",
        "--set", "comm.timeout_s=60"]


def run(name, ranks, micro_batch, overlap=True, zero=0, backend="auto"):
    run_dir = os.path.join(work, name)
    cmd = [mpiexec, "-n", str(ranks), trainer] + BASE + [
        "--set", f"parallel.dp={ranks}", "--set", f"train.micro_batch={micro_batch}", "--set", f"comm.backend={backend}",
        "--set", f"comm.overlap={'true' if overlap else 'false'}", "--set", f"optim.zero={zero}",
        "--set", f"run.dir={run_dir}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}")
    state = int(re.search(r"optimizer state [0-9.]+ MiB \((\d+) bytes\)", r.stdout + r.stderr).group(1))
    return [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))], state


reference, full_state = run("dp1", 1, 24)
CASES = [  # name, ranks, micro_batch (micro-batches per rank = 24 / ranks / micro_batch), overlap, zero[, backend]
    ("dp2_m1", 2, 12, True, 0), ("dp2_m2_no_overlap", 2, 6, False, 0), ("dp2_m3_zero", 2, 4, True, 1),
    ("dp2_m4_zero_no_overlap", 2, 3, False, 1), ("dp4_m1_zero", 4, 6, True, 1), ("dp4_m2", 4, 3, True, 0),
    ("dp4_m3_no_overlap", 4, 2, False, 0), ("dp1_zero", 1, 6, True, 1),
    ("dp2_m1_mpi", 2, 12, True, 0, "mpi"), ("dp2_m3_zero_mpi", 2, 4, True, 1, "mpi"), ("dp4_m2_mpi", 4, 3, True, 0, "mpi"),
]
failures = 0
by_name = {}
for name, ranks, mb, overlap, zero, *backend in CASES:
    losses, state = run(name, ranks, mb, overlap, zero, *backend)
    by_name[name] = losses
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
    # ZeRO-1 keeps 1/dp of the AdamW moments per rank (shards differ by at most one element per bucket).
    expect_state = full_state / ranks if zero else full_state
    state_ok = abs(state - expect_state) <= 0.01 * full_state
    ok = len(losses) == len(reference) and worst <= RTOL and state_ok
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(losses)} steps, max relative loss difference {worst:.2e}; "
          f"optimizer state {state} bytes per rank ({state / full_state:.3f} of one rank's)")
for shm, mpi in [("dp2_m1", "dp2_m1_mpi"), ("dp2_m3_zero", "dp2_m3_zero_mpi")]:
    same = by_name[shm] == by_name[mpi]
    failures += not same
    print(f"{'ok  ' if same else 'FAIL'} {shm} on shared memory and on mpi: {'identical' if same else 'different'} losses")
print(f"reference loss: first {reference[0]:.6f}, last {reference[-1]:.6f}")
assert reference[-1] < reference[0] - 0.3, "the reference did not train"
sys.exit(1 if failures else 0)
