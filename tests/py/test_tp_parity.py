"""Tensor parallelism (Megatron layers) reproduces the single-rank run: tp = 2 on 2 ranks, tp = 2 with a
vocabulary (250) that does not fill the padded shards evenly, tp = 4 on 4 ranks (one head per rank), and
dp = 2 x tp = 2 on 4 ranks (with and without ZeRO-1), and Megatron sequence parallelism (tp = 2 and
dp = 2 x tp = 2 with parallel.sequence_parallel, losses and step-1 gradients as below). Every step's loss must be within 1e-5 relative of the
single-rank run over 20 steps; the step-1 gradients (run.dump_grads: each tp shard's reduced gradients gathered
to their slice of the full tensor, as the model export gathers the weights) of tp = 2, tp = 4 and dp = 2 x
tp = 2 must match the single-rank run's tensor by tensor within 1e-5 relative (||g - g_ref|| / ||g_ref||), so
each shard's step-1 gradients equal the matching slice of the single-rank gradients; and the exported
model.safetensors (gathered from the tp shards) must hold the same tensor names and shapes as the single-rank
export; the values are compared on one-step runs with lr = 1e-30 (the initial weights, gathered).

Why 1e-5: the runs differ only in summation order (row-parallel matmuls and the vocabulary-parallel embedding,
head and cross-entropy sum per-rank partial results over tp; the gradient norm sums per-shard squares), which
moves fp32 results by ~1e-7 relative per step; AdamW over 20 steps amplifies that by at most ~10x. A real bug (a
missing or doubled all-reduce, a bias added twice, a wrong shard, a replicated gradient counted twice in the
norm) shows at the first step as an O(1e-2) or larger difference. Gradients: step 1 starts from identical weights, so only the summation order differs and each tensor's
relative difference is ~1e-7 (no optimizer amplification); the norm-relative measure is used because
individual elements near zero (e.g. rarely-seen embedding rows) have meaningless elementwise relative
differences, while a wrong slice, a missing tp all-reduce before a replicated LayerNorm's backward or a
gradient reduced twice moves the whole tensor by O(1e-1) or more. Weights: after 20 steps AdamW's normalised
update turns rounding-level gradient differences of rarely-used rows into differences up to ~1e-4, too close to
a useful bound, so the gather is checked on the initial weights instead: one step of lr = 1e-30 changes each
weight by at most ~1e-30 (a zero bias may become +-1e-30 depending on rounding), so the gathered export must
match the single-rank one within 1e-20 absolute, while a wrong shard or gather puts whole rows off by O(1e-2).
Standard library only.
Usage: test_tp_parity.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import subprocess
import sys

import parity_support
from parity_support import read_safetensors

mpiexec, trainer, src, work = sys.argv[1:5]
RTOL, WTOL = 1e-5, 1e-20
BASE = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "train.global_batch=8",
        "--set", "model.n_head=4", "--set", "train.steps=20", "--set", "run.log_every=100",
        "--set", "comm.timeout_s=60", "--set", "comm.bucket_mb=0.004"]


def run(name, ranks, tp, vocab=None, zero=0, initial=False, grads=False, sp=False, sets=()):
    run_dir = os.path.join(work, name)
    extra = ["--set", f"model.vocab_size={vocab}"] if vocab else []
    if sp:
        extra += ["--set", "parallel.sequence_parallel=true"]
    for s in sets:
        extra += ["--set", s]
    grads_path = os.path.join(run_dir, "grads.safetensors")
    if grads:
        extra += ["--set", f"run.dump_grads={grads_path}"]
    if initial:
        extra += ["--set", "train.steps=1", "--set", "optim.lr=1e-30", "--set", "optim.min_lr=0"]
    cmd = [mpiexec, "-n", str(ranks), trainer] + BASE + extra + [
        "--set", f"parallel.tp={tp}", "--set", f"parallel.dp={ranks // tp}", "--set", f"optim.zero={zero}",
        "--set", f"run.dir={run_dir}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {name} exited with {r.returncode}")
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    weights = read_safetensors(os.path.join(run_dir, "model.safetensors"))
    return losses, weights, (read_safetensors(grads_path) if grads else None)


def compare(name, losses, weights, ref_losses, ref_weights, check_values):
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    same_names = sorted(weights) == sorted(ref_weights)
    wdiff = 0.0
    shapes_ok = same_names
    if same_names:
        for k, (shape, vals) in weights.items():
            rshape, rvals = ref_weights[k]
            shapes_ok &= shape == rshape
            if shape == rshape and check_values:
                wdiff = max(wdiff, max(abs(a - b) for a, b in zip(vals, rvals)))
    ok = len(losses) == len(ref_losses) and worst <= RTOL and shapes_ok and wdiff <= WTOL
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(losses)} steps, max relative loss difference {worst:.2e}, "
          f"exported tensors {'match' if shapes_ok else 'DIFFER in names or shapes'}"
          + (f", max weight difference {wdiff:.2e}" if check_values else ""))
    return ok


def compare_grads(name, grads, ref_grads):
    return parity_support.compare_grads(name, grads, ref_grads, RTOL)


failures = 0
reference = run("tp1", 1, 1, grads=True)
ref250 = run("tp1_v250", 1, 1, vocab=250)
for name, ranks, tp, vocab, zero, grads in [("tp2", 2, 2, None, 0, True), ("tp2_v250", 2, 2, 250, 0, False),
                                            ("tp4", 4, 4, None, 0, True), ("dp2_tp2", 4, 2, None, 0, True),
                                            ("dp2_tp2_zero", 4, 2, None, 1, False)]:
    ref = ref250 if vocab else reference
    losses, weights, g = run(name, ranks, tp, vocab, zero, grads=grads)
    failures += not compare(name, losses, weights, ref[0], ref[1], False)
    if grads:
        failures += not compare_grads(name, g, reference[2])
init_ref = run("tp1_v250_initial", 1, 1, vocab=250, initial=True)
for name, ranks in [("tp2_v250_initial", 2), ("dp2_tp2_v250_initial", 4)]:
    losses, weights, _ = run(name, ranks, 2, vocab=250, initial=True)
    failures += not compare(name, losses, weights, init_ref[0], init_ref[1], True)
# Sequence parallelism (parallel.sequence_parallel): the residual stream and LayerNorms sharded by rows over tp,
# all-gathers / reduce-scatters in place of f / g, the LayerNorm weight gradients summed over tp. Same bounds.
# tp2_sp: micro-batches of 2 sequences, one whole sequence per rank; dp2_tp2_sp: micro-batch 1, so each rank
# holds half of a sequence (its positions offset into wpe).
for name, ranks, sets in [("tp2_sp", 2, ()), ("dp2_tp2_sp", 4, ("train.micro_batch=1",))]:
    losses, weights, g = run(name, ranks, 2, grads=True, sp=True, sets=sets)
    failures += not compare(name, losses, weights, reference[0], reference[1], False)
    failures += not compare_grads(name, g, reference[2])
# tp4_v250_sp: 4 ranks of tensor parallelism with sequence parallelism and a vocabulary (250, padded to 256)
# whose last shard holds the padding.
losses, weights, _ = run("tp4_v250_sp", 4, 4, vocab=250, sp=True)
failures += not compare("tp4_v250_sp", losses, weights, ref250[0], ref250[1], False)
print(f"reference loss: first {reference[0][0]:.6f}, last {reference[0][-1]:.6f}")
assert reference[0][-1] < reference[0][0] - 0.3, "the reference did not train"
sys.exit(1 if failures else 0)
