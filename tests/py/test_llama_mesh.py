"""Llama on every mesh reproduces the single-rank run, on 8 ranks: the factorizations 8 = dp x tp x pp that reach
Llama's own tensor-parallel code with the 1f1b schedule (1x1x8, 1x4x2, 1x8x1, where n_kv_head 4 puts each kv head
on two ranks, and 2x2x2; test_pp_parity.py runs the rest on GPT-2, through the same pipeline and data-parallel
code), every schedule (gpipe, interleaved with two chunks per rank, zb1) on
dp2 x tp2 x pp2, sequence parallelism with ZeRO-1 and uneven stages, n_kv_head equal to tp, larger and smaller than
it, and the head tied to the embedding across pipeline stages. Every step's loss (and the validation
losses of steps 10 and 20) within 1e-5 relative of one rank over 20 steps, also with fewer kv heads (2) than
tensor-parallel ranks (4), each kv head then held by two ranks, and with one kv head, held whole by all four (its
gradient norm counted on one of them: the norm clips, so a norm that differed between the ranks would update
their shards with different scales); the step-1 gradients of five layouts,
gathered from every shard, within 1e-5 per tensor; the exported model has the single-rank export's names and shapes.
Tolerances as in test_pp_parity.py, for the same reasons (only summation order differs). The peak learning rate is
3e-3, not tiny.yaml's 1e-2: at 1e-2 this model's loss spikes at step 8 (gradient norm 2), and the spike amplifies
rounding-level differences (1e-7 at step 7, with step-1 gradients equal to 8e-7) to 1e-3 by step 10, where no
tolerance could tell them from a bug; at 3e-3 it trains further (4.16 to 3.58) and the layouts agree to ~1e-7.
Usage: test_llama_mesh.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import os
import sys

from parity_support import compare_grads, max_relative_loss_difference, run_mesh

mpiexec, trainer, src, work = sys.argv[1:5]
RTOL = 1e-5
BASE = ["--config", os.path.join(src, "configs", "tiny.yaml"), "--set", "model.arch=llama",
        "--set", "model.n_layer=8", "--set", "model.n_head=8", "--set", "model.n_kv_head=4",
        "--set", "model.d_model=64", "--set", "model.ffn_hidden=96", "--set", "train.global_batch=16",
        "--set", "train.micro_batch=2", "--set", "train.steps=20", "--set", "run.log_every=100",
        "--set", "comm.timeout_s=120", "--set", "comm.bucket_mb=0.004", "--set", "train.eval_every=10",
        "--set", "train.eval_batches=2", "--set", "optim.lr=3e-3", "--set", "optim.min_lr=3e-4"]


def run(name, dp, tp, pp, sets=(), grads=False):
    losses, _, weights, g = run_mesh(mpiexec, trainer, BASE, os.path.join(work, name), dp, tp, pp, sets, grads)
    return losses, {k: v[0] for k, v in weights.items()}, g


failures = 0
refs = {}
CASES = []  # name, dp, tp, pp, settings, compare step-1 gradients, reference
for dp, tp, pp in [(1, 1, 8), (1, 4, 2), (1, 8, 1), (2, 2, 2)]:
    CASES.append((f"dp{dp}_tp{tp}_pp{pp}_1f1b", dp, tp, pp, (), (dp, tp, pp) in ((2, 2, 2), (1, 4, 2)), "untied"))
for schedule in ("gpipe", "interleaved", "zb1"):
    sets = [f"parallel.schedule={schedule}"] + (["parallel.virtual_stages=2"] if schedule == "interleaved" else [])
    CASES.append((f"dp2_tp2_pp2_{schedule}", 2, 2, 2, sets, schedule == "zb1", "untied"))
CASES.append(("dp2_tp2_pp2_uneven_zero_sp_zb1", 2, 2, 2,
              ["parallel.stage_layers=[5,3]", "optim.zero=1", "parallel.sequence_parallel=true",
               "parallel.schedule=zb1"], False, "untied"))
CASES.append(("dp2_tp2_pp2_tied", 2, 2, 2, ["model.tie_embeddings=true"], False, "tied"))
# Fewer kv heads than tp ranks: each kv head on tp / n_kv_head ranks, its weight gradient summed over them.
KV2, KV1 = "model.n_kv_head=2", "model.n_kv_head=1"
CASES.append(("dp1_tp4_pp2_kv2", 1, 4, 2, [KV2], True, "kv2"))
CASES.append(("dp2_tp4_pp1_kv1_zero", 2, 4, 1, [KV1, "optim.zero=1"], False, "kv1"))
CASES.append(("dp1_tp4_pp2_kv1_sp_zb1", 1, 4, 2, [KV1, "parallel.sequence_parallel=true", "parallel.schedule=zb1"],
              True, "kv1"))
for key, sets in (("untied", ()), ("tied", ("model.tie_embeddings=true",)), ("kv2", (KV2,)), ("kv1", (KV1,))):
    refs[key] = run(f"single_{key}", 1, 1, 1, sets, grads=key != "tied")
for name, dp, tp, pp, sets, grads, ref in CASES:
    losses, shapes, g = run(name, dp, tp, pp, sets, grads)
    worst = max_relative_loss_difference(losses, refs[ref][0])
    ok = worst <= RTOL and shapes == refs[ref][1]
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(losses)} losses (training and validation), max relative "
          f"difference {worst:.2e}, exported tensors {'match' if shapes == refs[ref][1] else 'DIFFER'}")
    failures += not ok
    if grads:
        failures += not compare_grads(name, g, refs[ref][2], RTOL)
print(f"reference loss: first {refs['untied'][0][0]:.6f}, last {refs['untied'][0][19]:.6f}")
assert refs["untied"][0][19] < refs["untied"][0][0] - 0.3, "the reference did not train"
sys.exit(1 if failures else 0)
