"""Every bad input of issue #2 is answered with exit status 2 and a message naming the problem, never a crash
or a hang (each run has a 60 s timeout); settings that are ignored are named by a warning in the log. Standard
library only.
Usage: test_bad_inputs.py TRAINER SOURCE_DIR WORK_DIR [MPIEXEC]"""
import os
import struct
import subprocess
import sys

trainer, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
mpiexec = sys.argv[4] if len(sys.argv) > 4 else None
os.makedirs(work, exist_ok=True)
tiny = os.path.join(src, "configs", "tiny.yaml")


def path(name, content=None):
    p = os.path.join(work, name)
    if content is not None:
        with open(p, "wb") as f:
            f.write(content if isinstance(content, bytes) else content.encode())
    return p


def llmc(tokens, magic=20240520, version=1, count=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)


good_tokens = [i % 64 for i in range(4096)]
tokens_file = path("good.bin", llmc(good_tokens))
fifo = path("data.fifo")
if os.path.exists(fifo):
    os.remove(fifo)
os.mkfifo(fifo)  # opening it would wait for a writer forever

CASES = [
    # (name, config file or None for tiny, --set overrides, words the message must contain)
    ("unknown key in the file", path("unknown.yaml", "model:\n  n_layers: 2\n"), [], ["model.n_layers", "model.n_layer"]),
    ("unknown key in --set", None, ["optim.l_r=1"], ["optim.l_r", "did you mean 'optim.lr'"]),
    ("a key given twice in the file", path("twice.yaml", "model:\n  n_layer: 2\n  n_head: 2\n  n_layer: 3\n"), [],
     ["model.n_layer", "twice", "lines 2 and 4"]),
    ("a section given twice in the file", path("twice_section.yaml", "model:\n  n_layer: 2\ntrain:\n  steps: 3\n"
                                                                      "model:\n  n_head: 2\n"), [],
     ["model", "twice", "lines 1 and 5"]),
    ("a FIFO as the data file", None, ["data.source=text", "model.vocab_size=256", f"data.path={fifo}"],
     ["data.fifo", "FIFO"]),
    ("/dev/zero as the token file", None, ["data.source=tokens", "data.path=/dev/zero"],
     ["/dev/zero", "character device"]),
    ("a FIFO as init_from", None, [f"model.init_from={fifo}"], ["data.fifo", "safetensors file", "FIFO"]),
    ("a FIFO as the config file", fifo, [], ["data.fifo", "config file", "FIFO"]),
    ("keep no checkpoints", None, ["run.keep_checkpoints=0"], ["run.keep_checkpoints", ">= 1"]),
    ("stop on a signal that cannot be caught", None, ["run.stop_signals=TERM,KILL"], ["run.stop_signals", "KILL"]),
    ("resume from a missing checkpoint", None, ["run.resume=" + path("no_such_checkpoint")],
     ["no_such_checkpoint", "not a directory"]),
    ("wrong type", None, ["model.n_layer=four"], ["model.n_layer", "four"]),
    ("fractional integer", None, ["train.steps=2.5"], ["train.steps", "2.5"]),
    ("missing config file", path("does_not_exist.yaml"), [], ["does_not_exist.yaml"]),
    ("malformed config", path("malformed.yaml", "model: [1, 2\n  n_layer: : 3\n"), [], ["malformed.yaml"]),
    ("config not a map", path("scalar.yaml", "42\n"), [], ["scalar.yaml"]),
    ("missing data file", None, ["data.source=tokens", f"data.path={path('nope.bin')}"], ["nope.bin"]),
    ("token file with a wrong magic number", None,
     ["data.source=tokens", "data.path=" + path("magic.bin", llmc(good_tokens, magic=20240521))], ["magic.bin", "magic number", "20240521"]),
    ("llm.c shard with a wrong version", None,
     ["data.source=tokens", "data.path=" + path("version.bin", llmc(good_tokens, version=7))], ["version.bin", "version"]),
    ("llm.c shard shorter than its header says", None,
     ["data.source=tokens", "data.path=" + path("short.bin", llmc(good_tokens, count=5000))], ["short.bin"]),
    ("raw token file of odd length", None,
     ["data.source=tokens", "data.path=" + path("odd.bin", b"\x01\x00\x02")], ["odd.bin"]),
    ("token id at vocab_size", None,
     ["data.source=tokens", "data.path=" + path("big.bin", llmc(good_tokens[:100] + [64] + good_tokens))],
     ["big.bin", "64"]),
    ("truncated safetensors", None, ["model.init_from=" + path("trunc.safetensors", struct.pack("<Q", 1000) + b"{}")],
     ["trunc.safetensors"]),
    ("safetensors header not JSON", None,
     ["model.init_from=" + path("json.safetensors", struct.pack("<Q", 8) + b"notjson!")], ["json.safetensors"]),
    ("safetensors offsets out of range", None,
     ["model.init_from=" + path("range.safetensors", struct.pack("<Q", 72) +
                                b'{"wte.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'.ljust(72) +
                                b"\0" * 4)],
     ["range.safetensors", "wte.weight"]),
    ("a GPT-2 safetensors file for a Llama", None,
     ["model.arch=llama", "model.init_from=" + path("gpt2_file.safetensors", struct.pack("<Q", 72) +
                                                    b'{"wte.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'.ljust(72) +
                                                    b"\0" * 8)],
     ["gpt2_file.safetensors", "wte.weight", "Llama", "model.arch=gpt2"]),
    ("a Llama safetensors file for a GPT-2", None,
     ["model.init_from=" + path("llama_file.safetensors", struct.pack("<Q", 104) +
                                b'{"model.layers.0.mlp.up_proj.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
                                .ljust(104) + b"\0" * 8)],
     ["llama_file.safetensors", "up_proj", "model.arch=llama"]),
    ("n_kv_head not dividing n_head", None, ["model.arch=llama", "model.n_kv_head=3"],
     ["model.n_kv_head=3", "model.n_head=2"]),
    ("rotary embeddings with an odd head size", None, ["model.arch=llama", "model.d_model=30"],
     ["model.arch=llama", "even head size", "15"]),
    ("a Llama key on a GPT-2", None, ["model.n_kv_head=1"], ["model.n_kv_head", "model.arch=llama"]),
    ("unknown recompute", None, ["train.recompute=some"], ["train.recompute", "some", "selective"]),
    ("full recompute with zb1", None, ["train.recompute=full", "parallel.schedule=zb1"],
     ["train.recompute=full", "parallel.schedule=zb1"]),
    ("global_batch not divisible by micro_batch, with values that work", None,
     ["train.global_batch=6", "train.micro_batch=4"],
     ["global_batch", "6", "4", "train.micro_batch=1, 2, 3, 6 (with global_batch 6)", "train.global_batch=4 or 8"]),
    ("a key by another trainer's name", None, ["optim.learning_rate=1"], ["did you mean 'optim.lr'"]),
    ("d_model not divisible by n_head", None, ["model.d_model=30", "model.n_head=4"], ["d_model", "30", "4"]),
    ("non-positive lr", None, ["optim.lr=0"], ["optim.lr"]),
    ("negative lr", None, ["optim.lr=-1e-3"], ["optim.lr"]),
    ("non-positive steps", None, ["train.steps=0"], ["train.steps"]),
    ("non-positive seq_len", None, ["model.seq_len=-4"], ["model.seq_len"]),
    ("unknown precision", None, ["precision.compute=fp8"], ["precision.compute", "fp8"]),
    ("unknown device", None, ["device=tpu"], ["device", "tpu"]),
    ("unknown schedule", None, ["parallel.schedule=zigzag"], ["parallel.schedule", "zigzag"]),
    ("unknown lr schedule", None, ["optim.schedule=step"], ["optim.schedule", "step"]),
    ("unknown flag", None, ["--bogus"], ["--bogus"]),
    ("bucket_mb not positive", None, ["comm.bucket_mb=0"], ["comm.bucket_mb"]),
    ("unknown comm.wait", None, ["comm.wait=spin"], ["comm.wait", "spin", "poll"]),
    ("negative emulation value", None, ["comm.emulate.latency_us=-5"], ["comm.emulate.latency_us"]),
    ("negative emulated bandwidth", None, ["comm.emulate.inter_bandwidth_gbps=-1"], ["comm.emulate.inter_bandwidth_gbps"]),
    ("dp*tp*pp differs from the number of ranks", None, ["parallel.dp=3"], ["parallel.dp", "3", "ranks (1)"]),
    # Checked before the mesh, so one rank suffices: tiny.yaml has d_model 32 (MLP width 128), n_head 2. n_head %
    # tp == 0 implies the MLP width divides, so the MLP check answers (first) only when n_head fails too.
    ("MLP width 4*d_model not divisible by tp", None, ["parallel.tp=3"], ["4*model.d_model", "128", "parallel.tp=3"]),
    ("n_head not divisible by tp", None, ["parallel.tp=4"], ["model.n_head=2", "parallel.tp=4"]),
    # The pipeline split is checked by load_config, before the mesh, so one rank suffices (tiny.yaml: n_layer 2);
    # the trainer's own "pipeline parallelism is not built yet" refusal comes later and must not answer these.
    ("pp larger than n_layer", None, ["parallel.pp=4"],
     ["parallel.pp=4 is larger than model.n_layer=2", "every pipeline stage needs at least one transformer block"]),
    ("stage_layers not summing to n_layer", None, ["parallel.pp=2", "parallel.stage_layers=[2,1]"],
     ["parallel.stage_layers=[2, 1] sums to 3 layers", "model.n_layer=2"]),
    ("stage_layers of the wrong length", None, ["parallel.pp=2", "parallel.stage_layers=[2]"],
     ["parallel.stage_layers=[2] needs one entry per virtual stage", "parallel.pp*virtual_stages=2*1=2", "has 1"]),
    ("stage_layers entry below 1", None, ["parallel.pp=2", "parallel.stage_layers=[2,0]"],
     ["parallel.stage_layers=[2, 0]", "entry 2 is 0"]),
    ("non-integer stage_layers entry in --set", None, ["parallel.stage_layers=[1,1.5]"],
     ["parallel.stage_layers", "list of integers", "'1.5'", "entry 2"]),
    ("non-integer stage_layers entry in the file",
     path("stage_block.yaml", "model: {n_layer: 2}\nparallel:\n  stage_layers:\n    - 1\n    - one\n"), [],
     ["parallel.stage_layers", "'one'", "entry 2", "stage_block.yaml"]),
    ("stage_layers not a list", None, ["parallel.stage_layers=2"],
     ["parallel.stage_layers", "list of integers", "'2'"]),
    ("interleaved on one pipeline stage", None, ["parallel.schedule=interleaved"],
     ["parallel.schedule=interleaved needs parallel.pp >= 2"]),
    ("seq_len not divisible by 2*cp", None, ["parallel.cp=2", "model.seq_len=18"],
     ["parallel.cp=2", "model.seq_len=18", "2*cp=4"]),
    ("cp with local SGD", None, ["parallel.cp=2", "optim.sync_every=2"], ["parallel.cp=2", "optim.sync_every=2"]),
    ("cp larger than the ranks", None, ["parallel.cp=2"], ["parallel.tp*pp*cp=1*1*2=2", "does not divide the 1 ranks"]),
    ("mesh order without pp", None, ["parallel.order=tp-cp-dp"], ["parallel.order='tp-cp-dp'", "permutation"]),
]
# (name, ranks, --set overrides, words): run through mpiexec with several ranks.
MPI_CASES = [
    ("global_batch not divisible by dp*micro_batch on 2 ranks", 2,
     ["train.global_batch=6", "train.micro_batch=2"],
     ["train.global_batch=6", "dp*micro_batch=2*2=4", "train.micro_batch=1, 3", "train.global_batch=4 or 8"]),
    ("dp*tp*pp differs from the number of ranks on 2 ranks", 2, ["parallel.dp=4"], ["parallel.dp", "ranks (2)"]),
    ("sequence_parallel with seq_len not divisible by tp on 2 ranks", 2,
     ["parallel.tp=2", "parallel.sequence_parallel=true", "model.seq_len=15"],
     ["model.seq_len=15", "parallel.tp=2"]),
    # dp*tp*pp = 2 matches the ranks here, so the pipeline checks are the only ones that can answer.
    ("n_layer not divisible by pp*virtual_stages on 2 ranks", 2, ["parallel.pp=2", "model.n_layer=3"],
     ["model.n_layer=3 is not divisible by parallel.pp*virtual_stages=2*1=2", "parallel.stage_layers"]),
    ("interleaved with micro-batches per step not a multiple of pp on 2 ranks", 2,
     ["parallel.pp=2", "parallel.virtual_stages=2", "parallel.schedule=interleaved", "model.n_layer=4",
      "train.global_batch=6", "train.micro_batch=2"],
     ["parallel.schedule=interleaved", "train.global_batch", "parallel.dp", "train.micro_batch", "= 6 / (1*2) = 3",
      "multiple of parallel.pp=2"]),
    ("negative staleness on 2 ranks", 2, ["optim.staleness=-1"], ["optim.staleness", ">= 0"]),
    ("staleness with ZeRO-1 on 2 ranks", 2, ["optim.staleness=2", "optim.zero=1"], ["optim.staleness", "optim.zero=0"]),
    ("ZeRO-3 reducing once per step on 2 ranks", 2, ["optim.zero=3", "optim.zero_reduce=step"],
     ["optim.zero_reduce=step", "optim.zero=3", "no rank holds a whole gradient buffer"]),
    ("ZeRO-3 with topk compression on 2 ranks", 2, ["optim.zero=3", "comm.compress=topk"],
     ["comm.compress=topk", "optim.zero=0", "ZeRO-3"]),
    ("ZeRO-3 with local SGD on 2 ranks", 2, ["optim.zero=3", "optim.sync_every=4"],
     ["optim.sync_every=4", "optim.zero=0"]),
    ("ZeRO-3 with staleness on 2 ranks", 2, ["optim.zero=3", "optim.staleness=1"], ["optim.staleness", "optim.zero=0"]),
    ("ZeRO-3 with comm.adapt on 2 ranks", 2, ["optim.zero=3", "comm.adapt=true"], ["comm.adapt", "ZeRO-3"]),
    ("ZeRO-2 with int8 compression on 2 ranks", 2, ["optim.zero=2", "comm.compress=int8"],
     ["comm.compress=int8", "optim.zero=0", "ZeRO-2"]),
    ("ZeRO-2 with local SGD on 2 ranks", 2, ["optim.zero=2", "optim.sync_every=4"],
     ["optim.sync_every=4", "optim.zero=0"]),
    ("ZeRO-2 with comm.adapt on 2 ranks", 2, ["optim.zero=2", "comm.adapt=true"], ["comm.adapt", "ZeRO-2"]),
    ("an unknown optim.zero_reduce on 2 ranks", 2, ["optim.zero=2", "optim.zero_reduce=sometimes"],
     ["optim.zero_reduce", "sometimes", "micro_batch", "step"]),
    ("staleness with tensor parallelism on 2 ranks", 2, ["optim.staleness=1", "parallel.tp=2"],
     ["optim.staleness", "parallel.tp=2"]),
    ("staleness with pipeline parallelism on 2 ranks", 2, ["optim.staleness=1", "parallel.pp=2"],
     ["optim.staleness", "parallel.pp=2"]),
    ("straggler rank outside the world on 2 ranks", 2, ["train.straggler.ranks=[2]", "train.straggler.slowdown=2"],
     ["train.straggler.ranks", "rank 2", "outside"]),
    ("missing data file on 2 ranks", 2, ["data.source=tokens", f"data.path={path('nope.bin')}"], ["nope.bin"]),
]

failures = 0
runs = [(name, cfg, sets, words, 1) for name, cfg, sets, words in CASES]
if mpiexec:
    runs += [(name, None, sets, words, ranks) for name, ranks, sets, words in MPI_CASES]
for name, cfg, sets, words, ranks in runs:
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [trainer, "--config", cfg or tiny]
    for s in sets:
        cmd += [s] if s.startswith("--") else ["--set", s]
    cmd += ["--set", "run.dir=" + os.path.join(work, "run")]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired:
        out, rc = "(timed out)", None
    missing = [w for w in words if w not in out]
    ok = rc == 2 and not missing
    failures += not ok
    last = out.strip().splitlines()[-1] if out.strip() else ""
    print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {rc}: {last}" + (f"  (missing {missing})" if missing else ""))
print(f"{len(runs) - failures}/{len(runs)} bad inputs answered with exit 2 and a message naming the problem")

# Settings a run ignores or regrets: it trains (exit 0) and the log says so. One short run on one rank: keys set
# where nothing reads them (data.path beside data.source=synthetic, an outer optimizer without local SGD,
# sub-block units where ZeRO-2 reduces once per step, ...), ZeRO with no replica to shard over, more compute
# threads than cores, evaluations longer than the validation split (its 6553 tokens hold 408 windows of 16), a
# warm-up longer than the run (tiny.yaml's 2 steps, of 1), and without a pipeline the memory line names no pipeline
# stage.
cores = len(os.sched_getaffinity(0))
ignored = {"data.path": tokens_file, "data.val_path": tokens_file, "optim.zero_unit": "sublayer",
           "optim.outer": "nesterov", "optim.outer_lr": "0.5", "optim.momentum": "0.5",
           "optim.staleness_policy": "fixed", "comm.powersgd_rank": "8", "comm.topk_fraction": "0.1",
           "comm.hierarchical": "true", "comm.adapt_sync_every_max": "8", "comm.emulate.inter_latency_us": "50.0",
           "parallel.sequence_parallel": "true", "train.straggler.delay_sigma": "2.0"}
cmd = [trainer, "--config", tiny, "--set", "train.steps=1", "--set", "optim.zero=2", "--set", "optim.zero_reduce=step",
       "--set", f"train.threads={cores + 1}", "--set", "train.eval_every=1", "--set", "train.eval_batches=150",
       "--set", "run.dir=" + os.path.join(work, "warn"), "--set", "run.resume=none"]
for key, value in ignored.items():
    cmd += ["--set", f"{key}={value}"]
r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
out = r.stdout + r.stderr
unnamed = [k for k, v in ignored.items() if f"{k}={v} is ignored: " not in out]
ok = (r.returncode == 0 and not unnamed and "optim.zero=2 shards nothing here" in out and
      f"train.threads={cores + 1} with 1 rank(s) on this node: {cores + 1} compute threads take turns on its {cores} "
      "cores" in out and "validation split (6553 tokens) holds 408 windows: each evaluation reads it 1.5 times over "
      "(train.eval_batches=102 reads it once)" in out and "optim.warmup_steps=2 is more than train.steps=1: the "
      "learning rate never reaches optim.lr=0.01 (the last step takes 5.000e-03)" in out and "peak activations" in out
      and "pipeline stage" not in out)
failures += not ok
print(f"{'ok  ' if ok else 'FAIL'} ignored settings are named: exit {r.returncode}, {len(ignored) - len(unnamed)} of "
      f"{len(ignored)} keys' warnings, ZeRO's, the threads', the evaluation's and the warm-up's, and a memory line "
      f"without a pipeline stage" + (f" (not named: {unnamed})" if unnamed else "") + ("" if ok else "\n" + out[-2000:]))

# The same kind of keys where they apply: no warning (local SGD with DiLoCo's outer optimizer and comm.adapt
# choosing its period, on two ranks).
if mpiexec:
    cmd = [mpiexec, "-n", "2", trainer, "--config", tiny, "--set", "train.steps=2", "--set", "optim.sync_every=2",
           "--set", "optim.outer=nesterov", "--set", "optim.outer_lr=0.5", "--set", "comm.adapt=true", "--set",
           "comm.adapt_sync_every_max=8", "--set", "run.dir=" + os.path.join(work, "applies"), "--set",
           "run.resume=none"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = r.stdout + r.stderr
    ok = r.returncode == 0 and "is ignored" not in out
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} the same kind of keys where they apply (local SGD, DiLoCo, comm.adapt): no "
          f"warning" + ("" if ok else "\n" + out[-2000:]))
sys.exit(1 if failures else 0)
