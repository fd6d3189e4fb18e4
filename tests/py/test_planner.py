#!/usr/bin/python3
"""build/planner end to end: its memory model against the trainer's measured peak tensor memory
(run.dir/memory.json) on small layouts of 1, 2 and 4 ranks (pipeline, ZeRO-1 and -2, 16-bit compute, context
parallelism, sequence parallelism, evaluation buffers) to the byte, and ZeRO-3 layouts to the byte on every pipeline
rank; ZeRO-3's predicted gather traffic per step (once per step without parallel.reshard_after_forward, in every
forward and backward pass with it); the JSON's fields and order; the table; the waits of ranks sharing cores
charged per thread per core; the cost of taking turns on a core measured, kept and overridden; the calibration's
neighbour processes;
scripts/validate_planner.py's --fit (with --fit-also) on results made from the planner's own predictions, and its
measurement in rounds; and every bad input answered with exit status 2.
No timing accuracy is asserted here (scripts/validate_planner.py measures it).

usage: test_planner.py PLANNER TRAINER MPIEXEC SOURCE_DIR WORK_DIR
"""
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys

PLANNER, TRAINER, MPIEXEC, SRC, WORK = sys.argv[1:6]
TINY = os.path.join(SRC, "configs", "tiny.yaml")
FIELDS = {"dp": int, "cp": int, "tp": int, "pp": int, "schedule": str, "virtual_stages": int, "micro_batch": int,
          "zero": int,
          "step_ms": float, "memory_mb": float, "tokens_per_s": float, "compute_ms": float, "exposed_comm_ms": float,
          "bubble_ms": float, "memory_bytes": int, "micro_batches": int, "rank": int, "mesh_best": bool}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def sets(args):
    out = []
    for s in args:
        out += ["--set", s]
    return out


# The planner's runtime constants as it defaults them, for runtime files that change some of them.
RUNTIME_DEFAULTS = {"p2p_latency_us": 2000, "poll_share": 0.15, "sync_latency_us": 75, "step_sync_us": 1000,
                    "ring_sync_us": 200}
WAIT_US = 100000  # the wait constants that waits_per_thread raises from 0 (it says why so long)
CALIBRATION = os.path.join(WORK, "tiny.calibration")  # the timed plans of tiny on 2 ranks share their timings


def planner(world, overrides, extra=()):
    cmd = [PLANNER, "--config", TINY, "--world", str(world), "--json"] + list(extra) + sets(overrides)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit("planner failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return json.loads(p.stdout)


def measured(world, overrides, name, steps=3):
    """Every rank's entry of the run's memory.json."""
    run_dir = os.path.join(WORK, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [MPIEXEC, "-n", str(world), TRAINER, "--config", TINY] + sets(
        overrides + ["train.steps=%d" % steps, "run.dir=" + run_dir, "run.resume=none", "run.log_every=1000"])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit("trainer failed: %s\n%s" % (" ".join(cmd), p.stdout[-3000:]))
    return json.load(open(os.path.join(run_dir, "memory.json")))["ranks"]


def measured_peak(world, overrides, name):
    return max(r["peak_tensor_bytes"] for r in measured(world, overrides, name))


def layout_sets_of(row):
    """The settings a row's command must make: its layout keys that differ from configs/tiny.yaml's (whose
    parallel.dp = 0 follows the other axes)."""
    tiny = {"cp": ("parallel.cp", 1), "tp": ("parallel.tp", 1), "pp": ("parallel.pp", 1),
            "schedule": ("parallel.schedule", "1f1b"), "virtual_stages": ("parallel.virtual_stages", 1),
            "micro_batch": ("train.micro_batch", 2), "zero": ("optim.zero", 0)}
    return ["%s=%s" % (key, row[k]) for k, (key, v) in tiny.items() if row[k] != v]


def layout_sets(layout):
    out = ["parallel.%s=%s" % (k, layout[k]) for k in ("dp", "tp", "pp", "schedule", "virtual_stages")]
    out.append("parallel.cp=%d" % layout.get("cp", 1))
    return out + ["train.micro_batch=%d" % layout["micro_batch"], "optim.zero=%d" % layout["zero"]]


def planned_row(world, other, layout, name):
    rows = planner(world, other, ["--memory-only"])
    layout = dict(layout, cp=layout.get("cp", 1))
    row = [r for r in rows if all(r[k] == v for k, v in layout.items())]
    check(len(row) == 1, "%s: the layout is listed once" % name)
    return row[0] if len(row) == 1 else None


def memory_cases():
    # (name, world, layout, other overrides)
    cases = [
        ("w1_1f1b", 1, dict(dp=1, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=2, zero=0), []),
        ("w1_gpipe_bf16", 1, dict(dp=1, tp=1, pp=1, schedule="gpipe", virtual_stages=1, micro_batch=1, zero=0),
         ["precision.compute=bf16"]),
        ("w2_dp_zero_bf16", 2, dict(dp=2, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=1),
         ["precision.compute=bf16", "precision.grad_reduce=bf16"]),
        ("w2_pp_zb1_eval", 2, dict(dp=1, tp=1, pp=2, schedule="zb1", virtual_stages=1, micro_batch=1, zero=0),
         ["train.eval_every=2", "train.eval_batches=1"]),
        ("w4_dp_pp_interleaved_zero", 4,
         dict(dp=2, tp=1, pp=2, schedule="interleaved", virtual_stages=1, micro_batch=1, zero=1),
         ["comm.bucket_mb=0.01"]),
        ("w2_dp_powersgd", 2, dict(dp=2, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=2, zero=0),
         ["comm.compress=powersgd", "comm.bucket_mb=0.01"]),
        # int8's buffers for the tp copies' own encoding (docs/compression.md, "Copies of a parameter").
        ("w4_dp_tp_int8", 4, dict(dp=2, tp=2, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=0),
         ["comm.compress=int8", "comm.bucket_mb=0.01"]),
        ("w2_dp_local_sgd_bf16", 2, dict(dp=2, tp=1, pp=1, schedule="gpipe", virtual_stages=1, micro_batch=1, zero=0),
         ["optim.sync_every=2", "optim.outer=nesterov", "precision.compute=bf16"]),
        ("w4_tp_pp_sp_fp16", 4, dict(dp=1, tp=2, pp=2, schedule="1f1b", virtual_stages=1, micro_batch=2, zero=0),
         ["parallel.sequence_parallel=true", "precision.compute=fp16"]),
        ("w1_llama_full", 1, dict(dp=1, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=2, zero=0),
         ["model.arch=llama", "model.n_kv_head=1", "model.multiple_of=16", "train.recompute=full"]),
        ("w2_llama_pp_selective", 2, dict(dp=1, tp=1, pp=2, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=0),
         ["model.arch=llama", "train.recompute=selective"]),
        ("w2_pp_gpipe_light", 2, dict(dp=1, tp=1, pp=2, schedule="gpipe", virtual_stages=1, micro_batch=1, zero=0),
         ["train.recompute=light"]),
        ("w2_dp_zero2_m2", 2, dict(dp=2, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=2),
         ["model.n_layer=4"]),
        ("w4_dp_pp_zb1_zero2_bf16", 4, dict(dp=2, tp=1, pp=2, schedule="zb1", virtual_stages=1, micro_batch=1, zero=2),
         ["precision.compute=bf16", "precision.grad_reduce=bf16"]),
        ("w2_tp_sp_full", 2, dict(dp=1, tp=2, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=2, zero=0),
         ["parallel.sequence_parallel=true", "train.recompute=full"]),
        # Context parallelism: a rank's half of each sequence, the ring's record and its temporaries per attention
        # call (GPT-2's q|k|v taken apart; Llama's are records), gradients averaged over dp x cp.
        ("w2_cp_bf16", 2, dict(dp=1, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=2, zero=0, cp=2),
         ["precision.compute=bf16"]),
        ("w4_llama_cp_pp_zero1", 4,
         dict(dp=1, tp=1, pp=2, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=1, cp=2),
         ["model.arch=llama", "model.n_kv_head=1"]),
        ("w4_dp_cp_zero3", 4, dict(dp=2, tp=1, pp=1, schedule="gpipe", virtual_stages=1, micro_batch=1, zero=3, cp=2),
         ["train.recompute=selective"]),
    ]
    for name, world, layout, other in cases:
        row = planned_row(world, other, layout, name)
        if row is None:
            continue
        predicted = row["memory_bytes"]
        peak = measured_peak(world, other + layout_sets(layout), name)
        check(predicted == peak, "%s: predicted peak %d bytes, measured %d (exact; %+d)" %
              (name, predicted, peak, predicted - peak))


def zero3_memory_cases():
    # ZeRO-3 to the byte, each pipeline rank's peak (dp rank 0, whose shards are the largest): (name, world, layout,
    # other overrides, whether the set-up moment is the peak). Two steps: the peak is reached in the first.
    llama = ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=96", "model.tie_embeddings=true"]
    cases = [
        # Units gathered in every pass, bf16 shards and buckets, the tied embedding pinned on both stages.
        ("w4_dp_pp_zero3_bf16", 4, dict(dp=2, tp=1, pp=2, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=3),
         ["precision.compute=bf16", "precision.grad_reduce=bf16", "parallel.reshard_after_forward=true"], False),
        # Sub-block units (three per block) in two slots shared with the gradients, Llama tied across the stages.
        ("w4_llama_dp_pp_zero3_sublayer", 4,
         dict(dp=2, tp=1, pp=2, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=3),
         llama + ["optim.zero_unit=sublayer", "parallel.reshard_after_forward=true"], False),
        # Every unit kept from the first pass (a whole chunk's buffers), Llama's head tied across the stages.
        ("w4_llama_dp_pp_zero3_keep", 4,
         dict(dp=2, tp=1, pp=2, schedule="gpipe", virtual_stages=1, micro_batch=1, zero=3),
         llama + ["parallel.reshard_after_forward=false"], False),
        # Wide blocks and short sequences, where one parameter outweighs the activations: the set-up draws each
        # parameter into its own gradient's buffer, so it stays below training's peak (drawn into a buffer of its
        # own, it was the peak, and this run measures above the prediction).
        ("w2_dp_zero3_keep_setup", 2, dict(dp=2, tp=1, pp=1, schedule="1f1b", virtual_stages=1, micro_batch=1, zero=3),
         ["model.d_model=128", "model.seq_len=8", "parallel.reshard_after_forward=false"], False),
    ]
    for name, world, layout, other, setup in cases:
        row = planned_row(world, other, layout, name)
        if row is None:
            continue
        ranks = measured(world, other + layout_sets(layout), name, steps=2)
        for stage in row["stages"]:
            got = [r["peak_tensor_bytes"] for r in ranks if r["pp_rank"] == stage["pp_rank"] and r["dp_rank"] == 0
                   and r["tp_rank"] == 0]
            check(got == [stage["peak_bytes"]], "%s: pipeline rank %d's peak predicted %d bytes, measured %s" %
                  (name, stage["pp_rank"], stage["peak_bytes"], got))
        peak = max(r["peak_tensor_bytes"] for r in ranks)
        check(row["memory_bytes"] == peak, "%s: predicted peak %d bytes, measured %d (exact)" %
              (name, row["memory_bytes"], peak))
        at_setup = row["memory"]["setup_bytes"] == row["memory_bytes"]
        check(at_setup == setup, "%s: the predicted peak is %s" % (name, "the set-up's" if setup else "training's"))


def zero3_gather_traffic(rows):
    # tiny on dp 2: one chunk of four parameter units (the final norm, two blocks, the tied embeddings). Without
    # parallel.reshard_after_forward each is gathered once per step: the chunk's parameters once. With it every
    # forward pass gathers the 3 unpinned units again and the pinned embedding stays; a backward pass right after a
    # forward pass keeps the final norm and block 1, which that pass ended with, and gathers block 0 (B bytes), any
    # other backward pass all 3; a forward pass right after a backward pass gathers all 3 too (in fp32 the ring is
    # shared with the gradients, written over the units the backward pass ended with). With m micro-batches, 1f1b
    # alternates the passes: m (P - E + B) + E bytes in 4m + 1 gathers; zb1 the same, with its weight pass (which
    # reads none) between and a ring of its own; gpipe runs m forward passes, then m backward passes.
    keep = planner(2, ["parallel.reshard_after_forward=false"], ["--reps", "1", "--calibration", CALIBRATION])
    # The rows given are the config's own: tiny.yaml leaves parallel.reshard_after_forward at its default, which
    # reshards on one pipeline stage.
    P = [r["memory"]["params_bytes"] for r in rows if r["dp"] == 2 and r["zero"] == 0][0]  # n fp32 parameters
    E = (64 * 32 + 16 * 32) * 4  # wte and wpe: configs/tiny.yaml's vocab_size x d_model and seq_len x d_model
    B = (P - E - 2 * 32 * 4) // 2  # a block: the rest but the final norm's weight and bias
    for want_keep in (True, False):
        for r in keep if want_keep else rows:
            if r["zero"] != 3 or r["dp"] != 2:
                continue
            m = r["micro_batches"]
            g = r.get("param_gathers", {})
            if want_keep:
                want = (4, P)
            elif r["schedule"] == "gpipe":
                want = (6 * m - 1, (2 * m - 1) * (P - E) + B + E)  # only the first backward pass keeps two
            else:
                want = (4 * m + 1, m * (P - E + B) + E)
            what = "%s mb%d (m %d), reshard_after_forward %s" % (r["schedule"], r["micro_batch"], m,
                                                                 "false" if want_keep else "true")
            check((g.get("count"), g.get("bytes")) == want and g.get("wait_ms", -1) > 0,
                  "ZeRO-3 %s: %s gathers of %s bytes per step predicted (want %d of %d), waited %s ms" %
                  (what, g.get("count"), g.get("bytes"), want[0], want[1], g.get("wait_ms")))


def json_fields(rows):
    check(len(rows) == 70,
          "tiny on 2 ranks: %d layouts in the JSON (hand count 70: tests/test_planner.cpp)" % len(rows))
    for r in rows:
        for k, t in FIELDS.items():
            if k not in r or not isinstance(r[k], (int, float) if t is float else t):
                check(False, "row %s: field %s missing or not %s" % (r.get("rank"), k, t.__name__))
                return
    check(True, "every row has " + ", ".join(FIELDS))
    check([r["rank"] for r in rows] == list(range(1, len(rows) + 1)), "ranks 1..n in order")
    steps = [r["step_ms"] for r in rows]
    check(all(s > 0 for s in steps), "step times positive")
    mesh_of = lambda r: (r["dp"], r["cp"], r["tp"], r["pp"])
    firsts = [r["rank"] for i, r in enumerate(rows) if all(mesh_of(q) != mesh_of(r) for q in rows[:i])]
    check([r["rank"] for r in rows if r["mesh_best"]] == firsts and len(firsts) == 4,
          "mesh_best marks the first row of each mesh, the table's rows (dp2, tp2, pp2, cp2): ranks %s" % firsts)
    check(all(a <= b * (1 + 1e-3) for a, b in zip(steps, steps[1:])), "rows ranked by predicted step time")
    check(all(abs(r["tokens_per_s"] - 4 * 16 / (r["step_ms"] / 1000)) <= 1e-3 * r["tokens_per_s"] + 1 for r in rows),
          "tokens_per_s = global_batch * seq_len / step")
    lim = sorted(r["memory_mb"] for r in rows)[len(rows) // 2]
    kept = planner(2, [], ["--memory-only", "--memory-limit-mb", str(lim)])
    check(0 < len(kept) < len(rows) and all(r["memory_mb"] <= lim for r in kept),
          "--memory-limit-mb %.3f keeps %d of %d layouts, each within it" % (lim, len(kept), len(rows)))
    # A limit that leaves out ZeRO-2/3 layouts whose sub-block units would fit: the table says how many.
    key = lambda r: tuple(r[k] for k in ("dp", "cp", "tp", "pp", "schedule", "virtual_stages", "micro_batch", "zero"))
    blocks = {key(r): r["memory_mb"] for r in planner(4, [], ["--memory-only"])}
    thirds = {key(r): r["memory_mb"] for r in planner(4, ["optim.zero_unit=sublayer"], ["--memory-only"])}
    lim = sorted(m for k, m in thirds.items() if k[7] == 3)[0] + 1e-3
    more = sum(1 for k, m in thirds.items() if k[7] >= 2 and m <= lim and not blocks.get(k, lim + 1) <= lim)
    p = subprocess.run([PLANNER, "--config", TINY, "--world", "4", "--memory-only", "--memory-limit-mb", "%.4f" % lim],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 0 and more > 0 and "%d more ZeRO-2/3 layout%s would fit within" % (more, "s" * (more > 1))
          in p.stdout and "optim.zero_unit=sublayer" in p.stdout,
          "--memory-limit-mb %.4f on 4 ranks: the table names the %d ZeRO-2/3 layouts sub-block units would fit"
          % (lim, more))
    table = ["--calibration", CALIBRATION, "--reps", "1"]
    p = subprocess.run([PLANNER, "--config", TINY, "--world", "2", "--top", "5", "--every-layout"] + table,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = p.stdout.splitlines()
    check(p.returncode == 0 and any("step_ms" in l and "memory_mb" in l for l in lines) and
          any("65 more" in l for l in lines), "the table with --every-layout: header, 5 rows, '65 more'")
    # By default the fastest row of each mesh (dp2, tp2, pp2, cp2 on 2 ranks), each followed by its command.
    p = subprocess.run([PLANNER, "--config", TINY, "--world", "2"] + table, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    lines = p.stdout.splitlines()
    meshes = [tuple(l.split()[1:2] + l.split()[3:4]) for l in lines if l[:5].strip().lstrip("=").isdigit()]
    commands = [l.strip() for l in lines if l.strip().startswith("mpirun -np 2 build/trainer --config " + TINY)]
    check(p.returncode == 0 and len(meshes) == 4 == len(set(meshes)) == len(commands) and
          any("66 more with another schedule" in l for l in lines),
          f"the table: one row per mesh {meshes}, each with its command, and the others counted")
    # Into a pipe, the timing's progress comes as whole lines every --progress-every seconds (none with 0).
    progress = {}
    for every in ("0.0001", "0"):
        p = subprocess.run([PLANNER, "--config", TINY, "--world", "2", "--json", "--reps", "1", "--rounds", "1",
                            "--progress-every", every], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120)
        progress[every] = [l for l in p.stderr.splitlines() if "timing the passes" in l]
    check(progress["0.0001"] and not any("\r" in l for l in progress["0.0001"]) and
          all(re.fullmatch(r"planner: timing the passes on this machine: \d+ shapes, [\d.]+ s", l)
              for l in progress["0.0001"]) and not progress["0"],
          f"--progress-every: {len(progress['0.0001'])} progress lines at 0.0001 s, {len(progress['0'])} at 0")
    # The fastest row's command runs that layout.
    top = rows[0]
    cmd = top["command"].split()
    want = ["--set " + s for s in layout_sets_of(top)]
    check(cmd[:4] == ["mpirun", "-np", "2", "build/trainer"] and all(w in top["command"] for w in want) and
          all(w[6:] in top["sweep_command"] for w in want),
          f"the JSON's commands set {want}: {top['command']} / {top['sweep_command']}")
    run_dir = os.path.join(WORK, "top_command")
    shutil.rmtree(run_dir, ignore_errors=True)
    r = subprocess.run([MPIEXEC, "-n", "2", TRAINER] + cmd[4:] + ["--set", "train.steps=2", "--set", "run.dir=" + run_dir,
                                                                 "--set", "run.log_every=1000"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    mesh = "mesh dp=%d x tp=%d x pp=%d" % (top["dp"], top["tp"], top["pp"]) + (" x cp=%d" % top["cp"] if top["cp"] > 1
                                                                                else "")
    check(r.returncode == 0 and mesh in r.stdout, f"the fastest row's command runs it: exit {r.returncode}, '{mesh}' "
                                                  "in its log")


def llama_step_model():
    # The time model on Llama, pipelined and not, with its head tied to the embedding (summed between the first and
    # last stage) and untied (no sum): it once indexed GPT-2's wte.weight in every Llama table.
    for tie in ("true", "false"):
        rows = planner(2, ["model.arch=llama", "model.n_kv_head=1", "model.multiple_of=16",
                           "model.tie_embeddings=" + tie], ["--reps", "1"])
        pp2 = [r for r in rows if r["pp"] == 2]
        check(len(rows) > 0 and len(pp2) > 0 and all(r["step_ms"] > 0 for r in rows),
              "Llama (tie_embeddings=%s) on 2 ranks: %d layouts timed, %d of them pipelined, every step time positive"
              % (tie, len(rows), len(pp2)))


def keyed(rows):
    """The planner's rows by layout."""
    return {tuple(r[k] for k in ("dp", "cp", "tp", "pp", "schedule", "virtual_stages", "micro_batch", "zero")): r
            for r in rows}


def one_core_steps(world, timings, extra, threads=1):
    """Each layout's predicted step_ms with the ranks on one core (taskset), the timings from (or saved to) the file
    `timings`, timed with as few repetitions as allowed and no time-slicing probe."""
    cmd = ["taskset", "-c", "0", PLANNER, "--config", TINY, "--world", str(world), "--json", "--calibration", timings,
           "--reps", "1", "--time-slicing", "0"] + list(extra) + sets(["train.threads=%d" % threads])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit("planner failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return {k: r["step_ms"] for k, r in keyed(json.loads(p.stdout)).items()}


def comm_thread_cpu(rows):
    # The communication thread's CPU (--comm-cpu-op-us, --comm-cpu-ns-per-byte): where the 2 ranks' compute threads
    # fill the cores (OMP_NUM_THREADS each, as ctest sets it, else cores / 2, which do on an even core count), a
    # layout whose gradients are averaged over 2 replicas (dp 2 or cp 2), or whose passes hold tensor-parallel
    # collectives (tp 2), runs longer by it; pp 2 (its messages are charged otherwise) does not change. Elsewhere (a
    # 16-core machine at one thread per rank) nothing changes.
    free = keyed(planner(2, [], ["--calibration", CALIBRATION, "--comm-cpu-op-us", "0",
                                 "--comm-cpu-ns-per-byte", "0"]))
    plain = keyed(rows)
    cores = len(os.sched_getaffinity(0))
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or max(1, cores // 2)  # the planner's, as the trainer's
    full = 2 * threads >= cores
    charged = [k for k in plain if k[0] * k[1] == 2 or k[2] == 2]
    check(charged and any(k[2] == 2 for k in charged) and
          all((plain[k]["step_ms"] > free[k]["step_ms"] + 1e-6) == full for k in charged) and
          all(abs(plain[k]["step_ms"] - free[k]["step_ms"]) < 1e-9 for k in plain if k not in charged),
          "communication thread's CPU: the %d rows of 2 replicas or tp 2 %s, the others unchanged (%d cores)" %
          (len(charged), "longer" if full else "unchanged", cores))
    # It stretches the passes: where the reductions outlast them (a slow link), the stretch takes the place of a
    # wait, so a row's step grows by less than its compute, and never by more. 1e-3 ms: the JSON's times have 4
    # decimals, so a difference of two differences is exact only to 2e-4.
    if not full:
        print("skip communication thread's CPU on a slow link: the compute threads leave cores spare here")
    else:
        slow_link = ["comm.emulate.bandwidth_gbps=0.005", "comm.emulate.latency_us=20", "comm.bucket_mb=0.01"]
        slow_free = keyed(planner(2, slow_link, ["--calibration", CALIBRATION, "--comm-cpu-op-us", "0",
                                                 "--comm-cpu-ns-per-byte", "0"]))
        slow = keyed(planner(2, slow_link, ["--calibration", CALIBRATION]))
        replicas = [k for k in charged if k[0] * k[1] == 2]  # their reductions: tp 2's collectives block the passes
        growth = [(slow[k]["step_ms"] - slow_free[k]["step_ms"], slow[k]["compute_ms"] - slow_free[k]["compute_ms"])
                  for k in replicas]
        check(all(step <= compute + 1e-3 for step, compute in growth) and
              any(step < compute - 1e-3 for step, compute in growth),
              "communication thread's CPU on a slow link: steps grow by less than their compute (%s ms)" %
              ", ".join("%.3f < %.3f" % g for g in growth[:4]))
    # The same two constants from a --fit file (optional keys there: older files keep the defaults).
    path = os.path.join(WORK, "runtime_cpu.json")
    json.dump(dict(RUNTIME_DEFAULTS, spread=0.1, comm_cpu_op_us=0, comm_cpu_ns_per_byte=0), open(path, "w"))
    from_file = keyed(planner(2, [], ["--calibration", CALIBRATION, "--runtime", path]))
    check(all(abs(from_file[k]["step_ms"] - free[k]["step_ms"]) < 1e-9 for k in free),
          "communication thread's CPU: a runtime file's comm_cpu_op_us and comm_cpu_ns_per_byte are read")


def waits_per_thread():
    # The waits of ranks that time-share the cores are charged per thread taking turns on a core. On one core
    # (taskset), 2 ranks of 1 thread are 2 threads per core and 2 ranks of 2 threads are 4: raising a wait's constant
    # from 0 to WAIT_US lengthens the rows it applies to about twice as much in the second (not exactly: a rank's
    # wait partly overlaps the other rank's compute, which then has the core to itself). WAIT_US is 100 ms so that
    # the waits outweigh the passes on any machine: at 1 ms, the 2-thread passes timed on one core of a 16-core Xeon
    # (no oneDNN) were long enough that rows grew only 1.17-1.96x as much (2026-12-04). --sync-latency-us on the
    # tp 2 rows (their collectives in the passes), --step-sync-us on the pp 2 rows (the step's collectives),
    # --ring-sync-us on the cp 2 rows. The step's collectives cost nothing more where data parallelism is all there
    # is (a rank waiting early leaves its core to the others): the dp 2 rows do not move with --step-sync-us, except
    # under ZeRO-2 and -3, whose gradient ring makes each gradient pass's end a wait of its own. That ring chains the
    # cp 2 rows' replicas too: at micro-batch 1 (4 micro-batches) they grow more under ZeRO-2 than under ZeRO-1
    # (with fewer, the reductions' end, which ZeRO-1 waits for too, hides the charge).
    for flag, axis in (("--sync-latency-us", 2), ("--step-sync-us", 3), ("--ring-sync-us", 1)):
        growth, dp_only, cp_rows = {}, {}, {}
        for threads in (1, 2):
            steps = {}
            for value in (0, WAIT_US):
                # One thread reuses the shared timings; two are timed once.
                timings = CALIBRATION if threads == 1 else os.path.join(WORK, "waits2.calibration")
                rows = one_core_steps(2, timings, [flag, str(value)], threads)
                steps[value] = {k: v for k, v in rows.items() if k[axis] == 2}
                if flag == "--step-sync-us":
                    dp_only[threads, value] = {k: v for k, v in rows.items() if k[0] == 2}
                    cp_rows[threads, value] = {k: v for k, v in rows.items() if k[1] == 2}
            growth[threads] = {k: steps[WAIT_US][k] - steps[0][k] for k in steps[0]}
            if flag == "--step-sync-us":
                before, after = dp_only[threads, 0], dp_only[threads, WAIT_US]
                same = [k for k in before if k[7] < 2]
                ring = [k for k in before if k[7] >= 2]
                # Unchanged: the rows are equal to the JSON's last digit. Lengthened: one gradient pass's charge is
                # 200 or 400 ms here (2 or 4 threads per core x WAIT_US); 0.5 ms tells it from rounding whatever the
                # reductions it overlaps.
                check(same and ring and all(abs(after[k] - before[k]) < 1e-6 for k in same) and
                      all(after[k] > before[k] + 0.5 for k in ring),
                      "--step-sync-us leaves the %d dp-only rows without ZeRO-2/3 alone and lengthens the %d with it "
                      "(%d thread(s) per rank)" % (len(same), len(ring), threads))
                # One micro-batch's ring charge is half a step sync at 2 replicas: 100 or 200 ms here, 400 or 800 in
                # all.
                grew = {k: cp_rows[threads, WAIT_US][k] - cp_rows[threads, 0][k] for k in cp_rows[threads, 0]}
                extra = [grew[k] - grew[k[:7] + (1,)] for k in grew
                         if k[6] == 1 and k[7] == 2 and k[:7] + (1,) in grew]
                check(extra and min(extra) > 0.5,
                      "--step-sync-us lengthens the %d cp 2 rows at micro-batch 1 more under ZeRO-2 than under ZeRO-1: "
                      "by %.2f-%.2f ms (%d thread(s) per rank)" %
                      (len(extra), min(extra or [0]), max(extra or [0]), threads))
        ratios = [growth[2][k] / growth[1][k] for k in growth[1] if growth[1][k] > 0]
        check(len(ratios) == len(growth[1]) > 0 and all(1.6 < x < 2.4 for x in ratios),
              "%s is charged per thread per core: %d rows grow %.2f-%.2fx as much at 4 threads per core as at 2" %
              (flag, len(growth[1]), min(ratios or [0]), max(ratios or [0])))


def comm_cpu_per_core():
    # Where ranks take turns on the cores, a rank's data-parallel communication CPU costs its step the square root of
    # the threads per core times its own time: on one core 2 ranks of one thread (2 per core) and of two (4 per
    # core) lengthen their dp 2 rows by it in the ratio 2 / sqrt(2). 0.01: the rows' 4 decimals. Every row must grow
    # by more than 0.1 ms at one thread (its buckets' CPU, 0.22 ms and more here), so that the ratio is not of
    # rounding.
    growth = {}
    for threads in (1, 2):
        timings = CALIBRATION if threads == 1 else os.path.join(WORK, "waits2.calibration")
        charged = one_core_steps(2, timings, [], threads)
        free = one_core_steps(2, timings, ["--comm-cpu-op-us", "0", "--comm-cpu-ns-per-byte", "0"], threads)
        growth[threads] = {k: charged[k] - free[k] for k in charged if k[0] == 2}
    ratios = [growth[2][k] / growth[1][k] for k in growth[1] if growth[1][k] > 0.1]
    check(len(ratios) == len(growth[1]) > 0 and all(abs(x - math.sqrt(2)) < 0.01 for x in ratios),
          "communication thread's CPU per thread per core: %d dp 2 rows grow %.3f-%.3fx as much at 4 threads per "
          "core as at 2 (sqrt(2))" % (len(growth[1]), min(ratios or [0]), max(ratios or [0])))


def norm_waits():
    # The gradient norm's all-reduces run back to back: only the first pays a step sync. On one core 4 ranks are 4
    # threads per core, so a step sync of 1000 us costs 4 ms, and a row's growth counts its step syncs: dp 1 x tp 2 x
    # pp 2 pays the tied embedding's sum, the loss and the norms' first (the pipeline's all-reduce follows the tp
    # one), dp 2 x pp 2 the tied sum, the reduction's end, the loss and the norm's. dp 2 x tp 2 (ZeRO-1) pays none:
    # tensor parallelism alone does not chain the step's collectives (its groups meet at every collective of their
    # passes and are replicas as dp's are). The step syncs add to the step exactly; 0.05 ms is far below one (4 ms)
    # and far above the rows' rounding (1e-4). (dp 2 x pp 2 under ZeRO-1 would pay a fifth where its parameter
    # all-gather outlasts the next step's first forward pass, as on a first stage it may: hence ZeRO-0 here.)
    timings = os.path.join(WORK, "norms4.calibration")
    steps = {value: one_core_steps(4, timings, ["--step-sync-us", str(value)])
             for value in (0, 1000)}
    for (dp, tp, pp, zero, syncs) in ((1, 2, 2, 0, 3), (2, 1, 2, 0, 4), (2, 2, 1, 1, 0)):
        grew = [steps[1000][k] - steps[0][k] for k in steps[0] if (k[0], k[2], k[3], k[7]) == (dp, tp, pp, zero)]
        check(grew and all(abs(g - 4 * syncs) < 0.05 for g in grew),
              "--step-sync-us 1000 lengthens the %d rows of dp %d x tp %d x pp %d, ZeRO-%d, on one core by %d step "
              "syncs (%d ms): %.2f-%.2f" % (len(grew), dp, tp, pp, zero, syncs, 4 * syncs, min(grew or [0]),
                                             max(grew or [0])))


def local_sgd_average():
    # Local SGD (optim.sync_every H): the replicas' parameter average, all of it at H = 1 and a quarter at H = 4, is
    # in the mean step as data-parallel communication; a pipeline of one replica averages nothing. On a 10 MB/s
    # link tiny's 28k fp32 parameters (112 KB) take about 11 ms to average over 2 replicas: more than 2. 1e-3 ms:
    # the JSON's times have 4 decimals, so a difference of two of them is exact only to 2e-4 (as in comm_thread_cpu).
    slow = ["comm.emulate.latency_us=100", "comm.emulate.bandwidth_gbps=0.01"]
    by_h = {h: keyed(planner(2, slow + ["optim.sync_every=%d" % h], ["--calibration", CALIBRATION]))
            for h in (1, 4)}
    replicas = [k for k in by_h[1] if k[0] == 2]
    pipes = [k for k in by_h[1] if k[0] == 1]
    avg = [by_h[1][k]["dp_comm_ms"] for k in replicas]
    check(replicas and pipes and min(avg) > 2 and
          all(abs(by_h[1][k]["dp_comm_ms"] - 4 * by_h[4][k]["dp_comm_ms"]) < 1e-3 and
              abs((by_h[1][k]["step_ms"] - by_h[4][k]["step_ms"]) -
                  (by_h[1][k]["dp_comm_ms"] - by_h[4][k]["dp_comm_ms"])) < 1e-3 for k in replicas) and
          all(by_h[1][k]["dp_comm_ms"] == 0 and abs(by_h[1][k]["step_ms"] - by_h[4][k]["step_ms"]) < 1e-9
              for k in pipes),
          "local SGD: the parameter average (%.2f-%.2f ms on dp 2) in the mean step, a quarter of it at H = 4 "
          "(%d rows); the %d rows of one replica unchanged" % (min(avg), max(avg), len(replicas), len(pipes)))


def tp_sync_once():
    # A tp collective's sync latency is one wait at any tp degree (docs/planner.md, "One sync per tp collective"). On
    # one core with 4 heads, dp 2 x tp 2 at micro-batch 1 and tp 4 at micro-batch 2 run 2 micro-batches of the same
    # tp collectives per step, so --sync-latency-us 1000 (4 ms each: 4 threads per core) lengthens both alike; charged
    # log2(tp) times, tp 4's would grow twice as much. ZeRO-0: no parameter gathers, which pay it too.
    timings = os.path.join(WORK, "heads4.calibration")
    extra = sets(["model.n_head=4"])
    steps = {value: one_core_steps(4, timings, ["--sync-latency-us", str(value)] + extra) for value in (0, 1000)}
    grew = {}
    for dp, tp, mb in ((2, 2, 1), (1, 4, 2)):
        grew[tp] = [steps[1000][k] - steps[0][k] for k in steps[0]
                    if (k[0], k[1], k[2], k[3], k[6], k[7]) == (dp, 1, tp, 1, mb, 0)]
    # More than 4 ms: at least one collective's wait; alike within 0.05 ms: far below one wait and far above the
    # rows' rounding (1e-4), as in norm_waits.
    check(grew[2] and grew[4] and min(grew[2]) > 4 and
          max(grew[2] + grew[4]) - min(grew[2] + grew[4]) < 0.05,
          "--sync-latency-us 1000 lengthens dp 2 x tp 2 at micro-batch 1 (%d rows) and tp 4 at micro-batch 2 (%d) "
          "alike: %s ms" % (len(grew[2]), len(grew[4]), ", ".join("%.2f" % g for g in grew[2] + grew[4])))


def time_slicing():
    # On one core (taskset) 2 ranks take turns: the planner measures what that costs once (2 processes running the
    # passes at once against one alone), says so, keeps it in the calibration file and reuses it; --time-slicing
    # overrides it, and the dp 2 rows' passes slow by 1 + slicing (ZeRO-3's have gather waits inside them).
    timings = os.path.join(WORK, "slicing.calibration")
    if os.path.exists(timings):
        os.remove(timings)
    cmd = ["taskset", "-c", "0", PLANNER, "--config", TINY, "--world", "2", "--json", "--calibration", timings,
           "--reps", "1"]
    runs = [subprocess.run(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
            for c in (cmd, [a for a in cmd if a != "--json"])]
    lines = [l.split() for l in open(timings) if l.startswith("slicing ")] if os.path.exists(timings) else []
    check(all(p.returncode == 0 for p in runs) and "2 ranks taking turns on 1 cores" in runs[0].stderr and
          len(lines) == 1 and lines[0][1] == "2" and float(lines[0][2]) >= 0,
          "time slicing: measured on one core and saved with the timings (%s)" %
          (" ".join(lines[0][1:]) if lines else runs[0].stderr.strip()[-300:]))
    header = "time slicing %.3f (from %s)" % (float(lines[0][2]), timings) if lines else "?"
    check(runs[1].returncode == 0 and "taking turns" not in runs[1].stderr and header in runs[1].stdout,
          "time slicing: read back from the calibration file, not measured again ('%s' in the table's header)" % header)
    steps = {}
    for value in ("0", "0.5"):
        p = subprocess.run(cmd + ["--time-slicing", value], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=120)
        steps[value] = {k: r for k, r in keyed(json.loads(p.stdout or "[]")).items() if k[0] == 2 and k[7] < 3}
        if p.returncode != 0:
            steps[value] = {}
    ratios = [steps["0.5"][k]["pipeline_ms"] / steps["0"][k]["pipeline_ms"] for k in steps["0"] if k in steps["0.5"]]
    # 1e-3: the JSON's pipeline_ms has 4 decimals, so a ratio of two of them is exact only to about 1e-4.
    check(len(ratios) > 0 and all(abs(x - 1.5) < 1e-3 for x in ratios),
          "--time-slicing 0.5: the passes of %d dp 2 rows on one core take %.4f-%.4fx as long as with 0" %
          (len(ratios), min(ratios or [0]), max(ratios or [0])))


def runtime_file(rows):
    # --runtime FILE (scripts/validate_planner.py --fit's constants): they change the predictions, a flag overrides
    # the file's value, and the file's spread decides which rows tie the first.
    path = os.path.join(WORK, "runtime.json")
    json.dump(dict(RUNTIME_DEFAULTS, p2p_latency_us=0, spread=0.5), open(path, "w"))
    table = ["--calibration", CALIBRATION, "--reps", "1", "--runtime", path]
    fitted = keyed(planner(2, [], table))
    back = keyed(planner(2, [], table + ["--p2p-latency-us", str(RUNTIME_DEFAULTS["p2p_latency_us"])]))
    plain = keyed(rows)
    pp = [k for k in plain if k[3] > 1]
    check(pp and all(fitted[k]["step_ms"] < plain[k]["step_ms"] for k in pp) and
          all(abs(back[k]["step_ms"] - plain[k]["step_ms"]) < 1e-6 for k in plain),
          "--runtime: p2p latency 0 from the file shortens every pipelined row; --p2p-latency-us overrides it")
    ordered = sorted(fitted.values(), key=lambda r: r["rank"])
    best = ordered[0]["step_ms"]
    check(all(r["ties_first"] == (r["step_ms"] <= 1.5 * best) for r in ordered) and
          any(r["ties_first"] for r in ordered[1:]) and not all(r["ties_first"] for r in ordered),
          "ties: the rows within the file's spread (50%%) of the first are marked, %d of %d" %
          (sum(r["ties_first"] for r in ordered), len(ordered)))
    # Every layout, so that the table's second row is the JSON's (by default it is the best of another mesh).
    p = subprocess.run([PLANNER, "--config", TINY, "--world", "2", "--top", "3", "--every-layout"] + table,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 0 and "from " + path in p.stdout and "within 50% of the first" in p.stdout and
          ("   =2  " in p.stdout) == ordered[1]["ties_first"],
          "the table names the runtime file and the spread, and marks ties with '='")
    # Without --runtime the defaults shape the ranking: the planner says so, and how to fit them (not with a file).
    bare = subprocess.run([PLANNER, "--config", TINY, "--world", "2", "--top", "1", "--calibration", CALIBRATION,
                           "--reps", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    warning = "runtime constants are the defaults, not fit on this machine"
    check(bare.returncode == 0 and warning in bare.stderr and "validate_planner.py --fit" in bare.stderr and
          warning not in p.stderr,
          "without --runtime the planner warns that its constants are not fit here, with --runtime it does not")
    # p2p_wake_us: a rank blocked on a pipeline message while the other ranks' threads take every core waits that
    # much more. Two ranks on one core (taskset): a pipeline of several micro-batches has such a wait (its last
    # stage waits for the first activation while the first stage computes the next forward), and so does zb1's of
    # one (the first stage waits for the gradient while the last computes its weight pass); another pipeline of
    # one micro-batch never (whoever waits, the other rank waits too), nor does a mesh without a pipeline.
    one_core = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    no_slicing = ["--calibration", os.path.join(WORK, "tiny-one-core.calibration"), "--reps", "1",
                  "--time-slicing", "0"]
    # Messages as fast as the link (no p2p or sync latency), so that they arrive while the passes run; 16
    # micro-batches of one sequence.
    json.dump(dict(RUNTIME_DEFAULTS, p2p_latency_us=0, sync_latency_us=0, p2p_wake_us=5000, spread=0.1),
              open(path, "w"))
    cmd = [PLANNER, "--config", TINY, "--world", "2", "--json"] + no_slicing + sets(["train.global_batch=16"])

    def one_core_rows(extra, cores=one_core):
        p = subprocess.run(cores + cmd + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=300)
        if p.returncode != 0:
            sys.exit("planner failed: %s\n%s" % (" ".join(cores + cmd + extra), p.stderr))
        return keyed(json.loads(p.stdout))
    woken, plain1 = one_core_rows(["--runtime", path]), one_core_rows(["--runtime", path, "--p2p-wake-us", "0"])
    by_kind = {"pipelined": [], "one micro-batch": [], "no pipeline": []}
    for k, r in plain1.items():
        kind = ("no pipeline" if r["pp"] == 1 else
                "one micro-batch" if r["micro_batches"] == 1 and r["schedule"] != "zb1" else "pipelined")
        by_kind[kind].append(woken[k]["step_ms"] - r["step_ms"])
    check(by_kind["pipelined"] and min(by_kind["pipelined"]) > 1 and by_kind["no pipeline"] and
          max(abs(d) for d in by_kind["no pipeline"] + by_kind["one micro-batch"]) < 1e-6,
          "p2p_wake_us 5000 from the file, 2 ranks on one core: pipelines of several micro-batches (and zb1's) "
          "%.1f-%.1f ms longer, %d rows of one micro-batch and %d without a pipeline unchanged; --p2p-wake-us 0 "
          "overrides it" %
          (min(by_kind["pipelined"] or [0]), max(by_kind["pipelined"] or [0]), len(by_kind["one micro-batch"]),
           len(by_kind["no pipeline"])))
    # Cold passes: where the ranks take turns on the cores (two on one core), the calibration also times each pass
    # after writing twice the last-level cache elsewhere (its "cold" lines), and each pass pays its cold extra (cold
    # less warm) times the share of the ranks' memory the cache cannot hold, at the shared speed. The file's cold
    # lines are set here to the warm times plus 2000 us (forward) and 3000 us (backward; zb1's input pass 1000, its
    # weight pass 2000), so that on the meshes without a pipeline or sharded parameters (both ranks' passes add
    # alike) a cache of almost nothing (the share 1) adds 2 ranks x micro-batches x 5000 us, and a cache of half the
    # two ranks' memory half that.
    json.dump(dict(RUNTIME_DEFAULTS, spread=0.1), open(path, "w"))
    one_core_rows(["--runtime", path, "--llc-mb", "1e-6"])  # times the cold passes into the file
    cal_file = no_slicing[1]
    lines = open(cal_file).read().splitlines()
    warm = {tuple(l.split()[1:12]): l.split()[12:16] for l in lines if l.startswith("stage ")}
    extra = [2000, 3000, 1000, 2000]
    cold = ["cold " + " ".join(l.split()[1:12] + ["%.3f" % (float(w) + e if float(w) > 0 else 0)
                                                  for w, e in zip(warm[tuple(l.split()[1:12])], extra)])
            for l in lines if l.startswith("cold ")]
    open(cal_file, "w").write("\n".join([l for l in lines if not l.startswith("cold ")] + cold) + "\n")
    plain_cold = one_core_rows(["--runtime", path, "--llc-mb", "0"])
    full = one_core_rows(["--runtime", path, "--llc-mb", "1e-6"])
    whole = [k for k, r in plain_cold.items() if r["pp"] == 1 and r["tp"] == 1 and r["cp"] == 1 and r["zero"] < 3]
    key = whole[0]
    half_llc = plain_cold[key]["memory_bytes"] / 2**20  # two ranks of this layout hold twice that
    half = one_core_rows(["--runtime", path, "--llc-mb", "%.9f" % half_llc])

    def expected_ms(k, share):
        return 2 * plain_cold[k]["micro_batches"] * 5000 * share / 1000
    grown = {k: full[k]["step_ms"] - plain_cold[k]["step_ms"] for k in whole}
    own_cores = [one_core_rows(["--runtime", path, "--llc-mb", llc], cores=[]) for llc in ("1e-6", "0")]
    # 2%: a longer backward pass hides a little more of ZeRO-2's per-pass ring (one such row grew 0.5% less than
    # its passes' extra); the others grow by it exactly, to the JSON's 4 decimals.
    check(cold and whole and all(abs(grown[k] - expected_ms(k, 1)) < 0.02 * expected_ms(k, 1) for k in whole) and
          abs(half[key]["step_ms"] - plain_cold[key]["step_ms"] - expected_ms(key, 0.5)) < 0.02 * expected_ms(key, 1)
          and (len(os.sched_getaffinity(0)) < 2 or  # (a machine of one core has no core per rank to compare with)
               all(abs(own_cores[0][k]["step_ms"] - own_cores[1][k]["step_ms"]) < 1e-6 for k in own_cores[1])),
          "2 ranks on one core: %d cold passes timed; with each 5000 us colder than warm per micro-batch, %d meshes "
          "of the whole model %.2f-%.2f ms longer with no cache to speak of (expected %.2f-%.2f), half that with half "
          "their memory in the cache, unchanged with --llc-mb 0, and on a core per rank" %
          (len(cold), len(whole), min(grown.values() or [0]), max(grown.values() or [0]),
           min(expected_ms(k, 1) for k in whole), max(expected_ms(k, 1) for k in whole)))
    for dropped in ("pass_refill_us", "refill_us_per_mparam"):
        json.dump(dict(RUNTIME_DEFAULTS, spread=0.1, **{dropped: 25}), open(path, "w"))
        p = subprocess.run([PLANNER, "--config", TINY, "--world", "2", "--top", "1", "--runtime", path] + no_slicing,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        check(p.returncode == 0 and '"%s" is no longer used' % dropped in p.stderr and "--fit" in p.stderr,
              "a runtime file with the fitted refill %s: the planner says it is no longer used and how to refit" %
              dropped)
    json.dump(dict(RUNTIME_DEFAULTS, spread=2), open(path, "w"))
    p = subprocess.run([PLANNER, "--config", TINY, "--world", "2", "--runtime", path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    check(p.returncode == 2 and '"spread" must be a number in [0, 1]' in p.stderr and path in p.stderr,
          "a runtime file with a spread of 2: exit 2 naming the file and the key: %s" % p.stderr.strip())


def neighbours():
    # --neighbours: the passes timed while other processes run the same passes on the other cores. The neighbour
    # itself: told a shape per line, it answers "ready" once it runs that shape's passes, switches at the next line
    # (a zb1 shape: split backward) and ends at the end of its input.
    child = subprocess.Popen([PLANNER, "--config", TINY, "--world", "2", "--neighbour-child"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    answers = []
    try:
        for shape in ("2 1 1 1 1 0 0 0 2 0 1 0 0 0 0", "1 1 0 2 1 0 0 1 3 0 1 0 0 0 0"):
            child.stdin.write(shape + "\n")
            child.stdin.flush()
            answers.append(child.stdout.readline().strip())
        child.stdin.close()
        rc = child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        rc = None
    check(answers == ["ready", "ready"] and rc == 0,
          "a neighbour answers 'ready' to each shape and exits 0 at the end of its input (%s, exit %s)" %
          (answers, rc))
    # The planner starts it for the timings, and the file's header counts it; a file of other timings (here: not
    # one at all, then the default's, timed alone) is timed afresh and overwritten, with a note.
    other = os.path.join(WORK, "other.calibration")
    open(other, "w").write("timings of something else\n")
    cmd = [PLANNER, "--config", TINY, "--world", "1", "--top", "1", "--reps", "1", "--rounds", "1", "--calibration",
           other]
    p = subprocess.run(cmd + ["--neighbours", "1", "--verbose"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    header = open(other).readline()
    check(p.returncode == 0 and "holds timings of another model" in p.stderr and
          "calibration: 1 neighbour process computing the same passes" in p.stderr and " neighbours 1 " in header,
          "--neighbours 1: the neighbour started, the header counts it, the file of other timings noted and "
          "overwritten")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(p.returncode == 0 and "holds timings of another model" in p.stderr and
          "neighbours" not in open(other).readline(),
          "the default (timed alone) does not take the neighbours' timings: noted, timed again, no count in the header")


def fit_from_results():
    # scripts/validate_planner.py --from-results --fit on "measurements" that are the planner's own predictions with
    # a p2p latency of 500 us: run A holds layouts without a pipeline (where that latency changes nothing), run B
    # pipelined ones and the fastest layout (the fit also scores the rank of each run's fastest). Fit to A alone
    # the constant would stay at its default (nothing there depends on it); with --fit-also B the fit finds 500.
    emulate = ["comm.emulate.latency_us=30", "comm.emulate.bandwidth_gbps=2", "train.eval_every=0"]
    truth = planner(2, emulate, ["--calibration", CALIBRATION, "--reps", "5", "--p2p-latency-us", "500"])
    runs = {}
    # Older planners listed gpipe with one micro-batch beside 1f1b (the same run): a sample holding both matches the
    # 1f1b row once.
    one = next(r for r in truth if r["pp"] == 1 and r["schedule"] == "1f1b" and r["micro_batches"] == 1)
    twin = dict(one, schedule="gpipe")
    for name, rows in (("A", [r for r in truth if r["pp"] == 1 and r is not one][:3] + [one, twin]),
                       ("B", truth[:1] + [r for r in truth if r["pp"] > 1][:3])):
        out = os.path.join(WORK, "fit_" + name)
        os.makedirs(out, exist_ok=True)
        shutil.copy(CALIBRATION, os.path.join(out, "calibration.json"))
        json.dump([[r, {"step_ms": r["step_ms"], "spread": 0.01, "memory_bytes": r["memory_bytes"], "other": 0,
                        "compute_ms": 0, "exposed_comm_ms": 0, "bubble_ms": 0}] for r in rows],
                  open(os.path.join(out, "results.json"), "w"))
        runs[name] = out
    path = os.path.join(WORK, "fit.json")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "scripts", "validate_planner.py"), "--build",
                        os.path.dirname(PLANNER), "--config", TINY, "--world", "2", "--out", runs["A"],
                        "--from-results", "--fit", path, "--fit-also", runs["B"]],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit("validate_planner --fit failed:\n" + p.stdout[-3000:])
    check("left out %dx1x1 gpipe mb%d z%d: the same run as %dx1x1 1f1b" % (one["dp"], one["micro_batch"], one["zero"],
                                                                         one["dp"]) in p.stdout,
          "--from-results: a sample's gpipe row with one micro-batch matches the 1f1b row, once")
    fitted = json.load(open(path))
    check(fitted["spread"] == 0.01 and fitted["fit"]["spread_within"] == 0.01 and
          fitted["fit"]["spread_across"] is None,
          "validate_planner --fit: the samples' own spread saved (one layout in both samples: none across): %s" %
          {k: fitted["fit"][k] for k in ("spread_within", "spread_across", "layouts_across")})
    check(fitted["p2p_latency_us"] == 500 and fitted["fit"]["mean_error"] < 1e-3 and
          fitted["fit"]["also"][0]["folder"] == runs["B"],
          "validate_planner --fit with --fit-also: the p2p latency behind the 'measurements' of A and B, 500 us "
          "(got %g)" % fitted["p2p_latency_us"])
    # --include names a layout to measure beside the sample, as the rows print it; one the planner does not list
    # stops the run before anything trains.
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "scripts", "validate_planner.py"), "--build",
                        os.path.dirname(PLANNER), "--config", TINY, "--world", "2", "--out", runs["A"],
                        "--include", "2x1x1 1f1b mb2 z0", "--include", "9x1x1 gpipe mb2 z0"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    check(p.returncode != 0 and "--include 9x1x1 gpipe mb2 z0: not among the planner's" in p.stdout and
          "pred_ms" not in p.stdout,  # the table's header: nothing ran
          "validate_planner --include of a layout the planner does not list: stops naming it: %s" %
          p.stdout.strip()[-200:])


def measured_in_rounds():
    # validate_planner measures its layouts in rounds, every layout once per round (a slow stretch of a VM's host
    # falls on one run of several layouts, not on every run of one), and keeps each layout's runs together.
    out = os.path.join(WORK, "rounds")
    p = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "scripts", "validate_planner.py"), "--build",
                        os.path.dirname(PLANNER), "--config", TINY, "--world", "2", "--best", "1", "--sample", "1",
                        "--steps", "5", "--warmup", "2", "--repeats", "2", "--out", out],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    order = re.findall(r"^round (\d)/2, layout (\d)/2: ", p.stdout, re.M)
    check(p.returncode == 0 and order == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")] and
          re.search(r"^run to run: a layout's runs differed by [\d.]+% in the median, up to [\d.]+%", p.stdout, re.M),
          "validate_planner: two layouts measured in two rounds, each layout once per round, and the runs' spread "
          "printed: %s" %
          (order if p.returncode == 0 else p.stdout[-1500:]))
    saved = json.load(open(os.path.join(out, "results.json"))) if p.returncode == 0 else []
    check(len(saved) == 2 and all(m["step_ms"] > 0 and m["spread"] >= 0 and m["speed"] > 0 for _, m in saved),
          "validate_planner: results.json holds each layout's measurement over its two runs: %s" %
          [{k: m.get(k) for k in ("step_ms", "spread", "speed")} for _, m in saved])


def spread_across_samples():
    # The spread a fit saves (validate_planner.measured_spread), which decides the ties: within a sample's runs, or
    # the range of layouts measured in several samples where at least three were and it is larger.
    spec = importlib.util.spec_from_file_location("validate_planner",
                                                  os.path.join(SRC, "scripts", "validate_planner.py"))
    vp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vp)
    within = [0.01, 0.02, 0.03]
    two = {"a": [100.0, 110.0], "b": [100.0, 104.0], "c": [50.0]}
    check(vp.measured_spread(within, two) == (0.02, 0.02, None, 2),
          "spread: two layouts measured in several samples are too few, the runs' own difference counts")
    three = dict(two, c=[50.0, 51.0, 52.0])  # ranges 10/105, 4/102, 2/51: the median 2/51
    got = vp.measured_spread(within, three)
    check(abs(got[0] - 2 / 51) < 1e-12 and got[1] == 0.02 and got[3] == 3,
          "spread: the median range over samples (3.9%%) where it exceeds the runs' own (2%%): %s" % (got,))
    close = {"a": [100.0, 100.5], "b": [100.0, 100.2], "c": [50.0, 50.1]}
    check(vp.measured_spread(within, close)[0] == 0.02,
          "spread: samples that agree better than a sample's own runs leave the runs' own difference")
    # A local SGD run is measured by its wall time per step (the planner predicts the mean; a median leaves the
    # averages out): its period read from the run's resolved config, whose comm section has keys ending in
    # sync_every too.
    measured(1, ["optim.sync_every=4"], "local_sgd_period", steps=1)
    periods = [vp.local_sgd_period(os.path.join(WORK, name)) for name in ("local_sgd_period", "w1_1f1b")]
    steps = [{"step_ms": ms, "elapsed_ms": at} for ms, at in ((10, 100), (12, 112), (30, 130))]
    check(periods == [4, 0] and vp.step_time(steps, True) == 15 and vp.step_time(steps, False) == 12,
          "validate_planner: local SGD's period from a run's config.yaml (%s), its wall time per step, else the "
          "median step" % periods)


def bad_inputs():
    cases = [
        (["--config", TINY], "missing --world"),
        (["--world", "2"], "missing --config"),
        (["--config", TINY, "--world", "0"], "--world"),
        (["--config", TINY, "--world", "two"], "--world"),
        (["--config", TINY, "--world", "-4"], "--world"),
        (["--config", TINY, "--world"], "--world needs a value"),
        (["--config", TINY, "--world", "3"], "no layout"),
        (["--config", os.path.join(WORK, "nonexistent.yaml"), "--world", "2"], "nonexistent.yaml"),
        (["--config", TINY, "--world", "2", "--set", "model.n_layr=3"], "model.n_layer"),
        (["--config", TINY, "--world", "2", "--set", "model.n_head=3"], "n_head"),
        (["--config", TINY, "--world", "2", "--set", "novalue"], "KEY=VALUE"),
        (["--config", TINY, "--world", "2", "--frobnicate"], "unknown argument"),
        (["--config", TINY, "--world", "2", "--memory-limit-mb", "x"], "--memory-limit-mb"),
        (["--config", TINY, "--world", "2", "--top", "-1"], "--top"),
        (["--config", TINY, "--world", "2", "--time-slicing", "-0.1"], "--time-slicing"),
    ]
    for args, needle in cases:
        p = subprocess.run([PLANNER] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        check(p.returncode == 2 and needle in p.stderr,
              "exit 2 naming '%s' for: planner %s (got %d: %s)" % (needle, " ".join(args[2:] if args[:1] == ["--config"]
                                                                                    else args), p.returncode,
                                                                   p.stderr.strip().splitlines()[:1]))
    p = subprocess.run([PLANNER, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check(p.returncode == 0 and "--world" in p.stdout and "--json" in p.stdout, "--help: exit 0 with the usage")


os.makedirs(WORK, exist_ok=True)
if os.path.exists(CALIBRATION):
    os.remove(CALIBRATION)  # timed afresh on every run
memory_cases()
zero3_memory_cases()
tiny2 = planner(2, [], ["--calibration", CALIBRATION])
json_fields(tiny2)
zero3_gather_traffic(tiny2)
comm_thread_cpu(tiny2)
runtime_file(tiny2)
local_sgd_average()
waits_per_thread()
comm_cpu_per_core()
norm_waits()
tp_sync_once()
time_slicing()
neighbours()
fit_from_results()
measured_in_rounds()
spread_across_samples()
llama_step_model()
bad_inputs()
if failures:
    sys.exit("%d check(s) failed" % len(failures))
print("all planner checks passed")
