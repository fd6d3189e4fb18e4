"""ZeRO-3 (optim.zero=3, parameters sharded too) reproduces the single-rank run on every mesh, gathers what it says.

  1. Exactness: every step's loss (and the validation losses of steps 10 and 20, whose forward passes gather the
     units too) within 1e-5 relative of one rank over 20 steps: GPT-2 on dp 8, dp2 x tp2 x pp2 (1f1b and
     interleaved), dp4 x tp2 with sequence parallelism, dp 2 accumulating 4 micro-batches (resharding, the default
     without pipeline parallelism, and not), dp2 x pp2 zb1 on uneven stages with light recomputation (whose weight
     pass reads parameters), full recomputation; Llama with one kv head (its copies on two tp ranks) on dp2 x tp2 x
     pp2 with the embedding tied across stages, resharding; sub-block units (optim.zero_unit=sublayer) on dp 2
     accumulating and on that Llama mesh. With pipeline parallelism the default keeps the units
     for the step; the
     interleaved and zb1 cases reshard. The gradients take ZeRO-2's path (a reduce-scatter per micro-batch), so
     only the summation order differs from one rank: about 1e-7 per step. A unit read before its gather (a stale
     or another unit's weights) shows as 1e-2 at the first step.
  2. With one micro-batch and no clipping, ZeRO-3 is ZeRO-2 bit for bit in bf16 and fp16 (the same fp32
     gradients, masters and shards; the forward and backward passes read the same gathered 16-bit weights), and
     in fp32 with and without bf16 gradient reduction (the gradients written over the parameters in their ring).
  3. What it gathers, from traces: with 4 micro-batches on dp 2, reshard_after_forward=false gathers what ZeRO-2
     gathers (every unit once per step), and true (2 x 4 - 1) gathers more of every unit but the pinned tied
     embedding (each unit again before each of the 8 passes), to the byte; one all-gather per unit and pass, not
     one per parameter.
  4. Memory (memory.json): on 8 blocks and dp 2 the parameters and gradients are this rank's half of the shards,
     two ring slots of one block that the two share, the pinned tied embedding's, and under accumulation one
     unit's shard of staged reductions; reshard_after_forward=false holds every unit and two gradient slots. At dp
     4 on a Llama whose states dominate, ZeRO-3 peaks below a quarter of ZeRO-0's peak plus three blocks; on a
     GPT-2 whose activations are 1.4 blocks, so with sub-block units.
  5. Checkpoints: written under ZeRO-3 on dp2 x pp2, resumed on one rank without ZeRO; written on one rank, resumed
     under ZeRO-3 on dp4 x tp2; both continue the single-rank run within 1e-5. A loaded model (model.init_from)
     trains as on one rank. The export of a ZeRO-3 run holds the one-rank run's weights.
  6. Every parameter read waits for its own bucket, forward and backward: with each bucket gathered only when a read
     or a wait asks for it (MESHTRAIN_INJECT=late-gather), the runs still match one rank, with sub-block units too.
Usage: test_zero3_parity.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import json
import os
import shutil
import sys

from parity_support import max_relative_loss_difference, read_safetensors, run_mesh

mpiexec, trainer, src, work = sys.argv[1:5]
RTOL = 1e-5
TINY = os.path.join(src, "configs", "tiny.yaml")
BASE = ["--config", TINY, "--set", "model.n_layer=4", "--set", "model.n_head=4", "--set", "train.global_batch=16",
        "--set", "train.micro_batch=2", "--set", "train.steps=20", "--set", "run.log_every=100",
        "--set", "comm.timeout_s=120", "--set", "comm.bucket_mb=0.004", "--set", "train.eval_every=10",
        "--set", "train.eval_batches=2", "--set", "optim.lr=3e-3", "--set", "optim.min_lr=3e-4"]
LLAMA = ["model.arch=llama", "model.n_kv_head=1", "model.ffn_hidden=96", "model.tie_embeddings=true"]
Z3 = ["optim.zero=3"]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += not ok


def rows(name):
    return [json.loads(line) for line in open(os.path.join(work, name, "metrics.jsonl"))]


def run(name, dp, tp, pp, sets=()):
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    return run_mesh(mpiexec, trainer, BASE, os.path.join(work, name), dp, tp, pp, sets)[:3]


SUB = ["optim.zero_unit=sublayer"]
# 1. Exactness against one rank.
single, _, single_weights = run("single", 1, 1, 1, ["run.checkpoint_every=10"])
refs = {"gpt2": single, "llama": run("single_llama", 1, 1, 1, LLAMA)[0]}
CASES = [  # name, dp, tp, pp, settings, reference
    ("dp8", 8, 1, 1, Z3, "gpt2"),
    ("dp2_tp2_pp2_1f1b", 2, 2, 2, Z3, "gpt2"),
    ("dp2_tp2_pp2_interleaved_reshard", 2, 2, 2, Z3 + ["parallel.schedule=interleaved", "parallel.virtual_stages=2",
                                                       "parallel.reshard_after_forward=true"], "gpt2"),
    ("dp4_tp2_sp", 4, 2, 1, Z3 + ["parallel.sequence_parallel=true"], "gpt2"),
    ("dp2_m4", 2, 1, 1, Z3, "gpt2"),
    ("dp2_pp2_zb1_uneven_light_reshard", 2, 1, 2, Z3 + ["parallel.schedule=zb1", "parallel.stage_layers=[3,1]",
                                                      "train.recompute=light", "parallel.reshard_after_forward=true"],
     "gpt2"),
    ("dp2_m4_recompute_full", 2, 1, 1, Z3 + ["train.recompute=full"], "gpt2"),
    ("dp2_m4_no_reshard", 2, 1, 1, Z3 + ["parallel.reshard_after_forward=false"], "gpt2"),
    # One kv head on two tp ranks: each holds a copy whose gradients are summed over tp (copied_param_grads).
    ("llama_dp2_tp2_pp2_tied_reshard", 2, 2, 2, Z3 + LLAMA + ["parallel.reshard_after_forward=true"], "llama"),
    # Sub-block units (optim.zero_unit=sublayer): the reads drive the two-slot ring, three units per block.
    ("dp2_m4_sublayer", 2, 1, 1, Z3 + SUB, "gpt2"),
    ("llama_dp2_tp2_pp2_tied_sublayer", 2, 2, 2, Z3 + LLAMA + SUB + ["parallel.reshard_after_forward=true"], "llama"),
]
for name, dp, tp, pp, sets, ref in CASES:
    losses, log, _ = run(name, dp, tp, pp, sets)
    worst = max_relative_loss_difference(losses, refs[ref])
    check(worst <= RTOL and "ZeRO-3" in log,
          f"{name}: {len(losses)} losses (training and validation), max relative difference {worst:.2e}")
check(refs["gpt2"][19] < refs["gpt2"][0] - 0.3, f"the reference trained ({refs['gpt2'][0]:.4f} -> {refs['gpt2'][19]:.4f})")

# 2. One micro-batch, no clipping: ZeRO-3 is ZeRO-2 bit for bit in 16-bit compute, and in fp32, where its
# gradients share the parameters' ring and are reduced straight into the shards (or, sent in bf16, from their wire
# copies).
for name, sets in (("bf16", ["precision.compute=bf16"]), ("fp16", ["precision.compute=fp16"]), ("fp32", []),
                   ("fp32_wire_bf16", ["precision.grad_reduce=bf16"])):
    one = ["train.micro_batch=8", "train.grad_clip=0"] + sets
    z2 = run(f"m1_zero2_{name}", 2, 1, 1, one + ["optim.zero=2"])[0]
    z3 = run(f"m1_zero3_{name}", 2, 1, 1, one + Z3)[0]
    check(z2 == z3, f"{name}, one micro-batch: ZeRO-3's {len(z3)} losses equal ZeRO-2's bit for bit")

# 3. What is gathered, from traces of 3 steps of 4 micro-batches on dp 2 without evaluation (each rank's
# collectives are all in its trace, whatever step's row their bytes land in: counted there, not from metrics.jsonl).
# A unit is one all-gather with these buckets, sending this rank's half of it. With resharding, per step 4 forward
# passes gather the 5 unpinned units (4 blocks and ln_f; a backward pass leaves its last units' gradients in the
# ring, not their weights); 4 backward passes the 3 that their forward pass did not leave in the ring (it ends with
# block 3 and ln_f, which the backward pass reads first); and the step's first pass the pinned tied embedding's unit.
# Without, every unit once per step, as ZeRO-2's gather after the optimizer.
# After the last step ZeRO-3's optimizer gathers the next step's first units for a step that never comes (resharding:
# the embeddings and block 0; without: every unit), and the export gathers every unit once more (ZeRO-2 exports its
# whole fp32 weights without a gather). tiny.yaml's d_model 32, vocabulary 64, 16 positions.
C = 32
embedding = 64 * C + 16 * C
block = 12 * C * C + 13 * C
n_params = sum(len(v[1]) for v in single_weights.values())
TRACED = ["train.steps=3", "train.eval_every=0", "comm.bucket_mb=25", "run.profile=true"]


def traced_gathers(name, sets):
    """(all-gathers, their bytes) of rank 0 and the count of rank 1's."""
    run(name, 2, 1, 1, sets + TRACED)
    trace = json.load(open(os.path.join(work, name, "trace.json")))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    mine = [e for e in events if e.get("pid") == 0 and e.get("name") == "dp all_gather"]
    return len(mine), sum(e["args"]["bytes"] for e in mine), sum(
        1 for e in events if e.get("pid") == 1 and e.get("name") == "dp all_gather")


count, resharded, other = traced_gathers("gathers_reshard", Z3)
_, kept, _ = traced_gathers("gathers_keep", Z3 + ["parallel.reshard_after_forward=false"])
_, zero2, _ = traced_gathers("gathers_zero2", ["optim.zero=2"])
want = 3 * (4 * 5 + 4 * 3 + 1) + 2 + 6
whole = 4 * n_params // 2  # every unit once: the export's gather, and the last prefetch without resharding
prefetched = 4 * (embedding + block) // 2  # the last prefetch with resharding
extra = 3 * ((2 * 4 - 1) * (n_params - embedding) - 4 * (block + 2 * C)) * 4 // 2 + prefetched - whole
check(count == other == want, f"dp all-gathers in 3 traced steps: {count} and {other} per rank, {want} expected (one "
      f"per unit and pass, where one per parameter would be 12 per block: DeepSpeed #5047's many tiny gathers)")
check(kept - zero2 == 2 * whole and resharded - kept == extra,
      f"bytes gathered in 3 steps: reshard_after_forward=false {kept} = ZeRO-2's {zero2} + the last prefetch's "
      f"{whole} + the export's {whole}; true {resharded - kept} more, {extra} expected (7 more gathers of the "
      f"{n_params - embedding} unpinned parameters per step, less block 3 and ln_f in the 4 backward passes, and "
      f"a last prefetch of {prefetched})")


# 4. Memory: the parameters and gradients on 8 blocks and dp 2 (4 micro-batches per step, or 1).
def state_bytes(name, sets):
    run(name, 2, 1, 1, Z3 + ["model.n_layer=8", "train.steps=2", "train.eval_every=0"] + sets)
    ranks = json.load(open(os.path.join(work, name, "memory.json")))["ranks"]
    return max(r["params_bytes"] for r in ranks), max(r["grads_bytes"] for r in ranks)


n = 8 * block + embedding + 2 * C
half = n // 2  # rank 0's shard of each bucket is half of it, rounded up
shared = state_bytes("memory_zero3", [])
once = state_bytes("memory_zero3_m1", ["train.micro_batch=8"])
every = state_bytes("memory_zero3_no_reshard", ["parallel.reshard_after_forward=false"])
# Parameters: the pinned tied embedding and the shards. Gradients: two ring slots (the gathered parameters, each
# gradient written over its own), the pinned embedding's, the shards, and with 4 micro-batches half a block of staged
# reductions.
want_shared = (4 * (embedding + half), 4 * (2 * block + embedding + half + (block + 1) // 2))
want_once = (want_shared[0], want_shared[1] - 4 * ((block + 1) // 2))
# Without resharding the parameters keep every unit, and the gradients two ring slots of their own.
want_every = (4 * (n + half), 4 * (2 * block + embedding + half))
near = lambda got, want: all(w <= g <= w + 4 * 100 for g, w in zip(got, want))  # round-ups
check(near(shared, want_shared) and near(once, want_once) and near(every, want_every),
      f"8 blocks, dp 2: ZeRO-3 holds {shared} parameter and gradient bytes, {want_shared} + round-ups expected "
      f"(two block slots shared by both, the tied embedding, half the shards, half a block of staged "
      f"reductions); {once} with one micro-batch ({want_once}: no staging); without resharding {every} "
      f"({want_every}: every unit, two gradient slots)")

def memory_bar(name, args, block_prefix, zero3_sets=()):
    """Issue #33's bar at dp 4: ZeRO-3's peak tensor memory <= ZeRO-0's / 4 + three blocks' fp32 weights."""
    peaks = {}
    for z, sets in ((0, []), (3, list(zero3_sets))):
        folder = os.path.join(work, f"{name}_zero{z}")
        shutil.rmtree(folder, ignore_errors=True)
        _, _, weights, _ = run_mesh(mpiexec, trainer, args, folder, 4, 1, 1, [f"optim.zero={z}"] + sets)
        peaks[z] = max(r["peak_tensor_bytes"] for r in json.load(open(os.path.join(folder, "memory.json")))["ranks"])
    block = 4 * sum(len(v[1]) for k, v in weights.items() if k.startswith(block_prefix))
    bound = peaks[0] // 4 + 3 * block
    check(peaks[3] <= bound, f"{name}, dp 4: ZeRO-3's peak {peaks[3]} bytes <= ZeRO-0's {peaks[0]} / 4 + 3 blocks of "
          f"{block} = {bound} ({(peaks[3] / bound - 1) * 100:+.1f}%)")


# Issue #33's bar: at dp 4, on a model whose states dominate its activations (Llama, 8 blocks of C = 256, one
# sequence of 8 tokens per rank, full recomputation), ZeRO-3's peak tensor memory is at most a quarter of ZeRO-0's
# plus three blocks' fp32 weights. It holds two blocks (each gradient written over its parameter) and its
# activations whole: 8% under the bound (with a third slot for the gradients it was 0.9% over).
SMALL_BAR = ["--set", "model.n_layer=8", "--set", "model.d_model=256", "--set", "train.micro_batch=1", "--set",
             "train.global_batch=4", "--set", "train.steps=2", "--set", "train.eval_every=0", "--set",
             "run.log_every=100"]
memory_bar("llama_T8_recompute_full", ["--config", os.path.join(src, "configs", "llama-tiny.yaml"), "--set",
                                       "model.n_head=8", "--set", "model.seq_len=8", "--set", "train.recompute=full"]
           + SMALL_BAR, "model.layers.0.")
# Where the activations outgrow the block the two slots leave free (GPT-2, T 32, no recomputation: 1.4 blocks, 2.7%
# over with whole blocks), sub-block units hold two thirds of a block in the slots instead of two blocks.
memory_bar("gpt2_T32_sublayer", ["--config", os.path.join(src, "configs", "gpt.yaml"), "--set", "model.seq_len=32"]
           + SMALL_BAR, "h.0.", SUB)

# 5. Checkpoints across ZeRO-3 and other meshes, and the export.
run("ckpt_zero3", 2, 1, 2, Z3 + ["run.checkpoint_every=10"])
for name, dp, tp, pp, sets, source in [
        ("resume_zero3_on_one", 1, 1, 1, [], "ckpt_zero3"),
        ("resume_one_on_zero3", 4, 2, 1, Z3, "single")]:
    ckpt = os.path.join(work, source, "checkpoints", "step_00000010")
    losses, log, _ = run(name, dp, tp, pp, list(sets) + [f"run.resume={ckpt}"])
    worst = max_relative_loss_difference(losses[:10], refs["gpt2"][10:20])
    check(len(losses) >= 10 and "resumed from" in log and worst <= RTOL,
          f"{name}: steps 11-20 within {worst:.2e} of the uninterrupted single-rank run")
# A loaded model (model.init_from: the one-rank run's export), sharded at set-up: 5 steps on one rank and under
# ZeRO-3 on dp2 x pp2, within 1e-5.
loaded = ["model.init_from=" + os.path.join(work, "single", "model.safetensors"), "train.steps=5",
          "train.eval_every=0"]
one = run("init_from_one", 1, 1, 1, loaded)[0]
worst = max_relative_loss_difference(run("init_from_zero3", 2, 1, 2, Z3 + loaded)[0], one)
check(worst <= RTOL, f"model.init_from under ZeRO-3 on dp2 x pp2: 5 steps within {worst:.2e} of one rank")
exported = read_safetensors(os.path.join(work, "ckpt_zero3", "model.safetensors"))
worst = max(max(abs(a - b) for a, b in zip(exported[k][1], single_weights[k][1])) for k in single_weights)
# Rounding-level differences in the losses (about 1e-7) leave the weights within a few 1e-6 after 20 steps (2.2e-6
# measured); a shard missing from the export would leave whole rows at 0 (0.02 off).
check(sorted(exported) == sorted(single_weights) and worst < 1e-5,
      f"the export of ZeRO-3 on dp2 x pp2 holds every tensor, at most {worst:.1e} from the one-rank run's weights")

# 6. Every read waits for its own bucket, in both passes: with MESHTRAIN_INJECT=late-gather a bucket is gathered only
# when a read or a wait asks for it, so a parameter read without asking sees whatever its slot held (another unit's
# weights, or gradients) on every run. Four micro-batches in fp32 (the ring shared with the gradients: a backward
# pass reads no bias, whose buckets are gathered when its gradient is written over it), and Llama with full
# recomputation (a block's forward pass again inside the backward pass).
os.environ["MESHTRAIN_INJECT"] = "late-gather@1"
for name, sets, ref in [("late_gather_dp2_m4", Z3, "gpt2"), ("late_gather_dp2_m4_sublayer", Z3 + SUB, "gpt2"),
                        ("late_gather_llama_dp2_recompute_full", Z3 + LLAMA + ["train.recompute=full"], "llama")]:
    losses, log, _ = run(name, 2, 1, 1, sets)
    worst = max_relative_loss_difference(losses, refs[ref])
    check(worst <= RTOL and "late-gather" in log, f"{name}: every bucket gathered on demand, max relative "
          f"difference {worst:.2e}")
del os.environ["MESHTRAIN_INJECT"]
sys.exit(1 if failures else 0)
