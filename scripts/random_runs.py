#!/usr/bin/python3
"""Random whole-trainer runs: seeded draws of a model, a mesh and features, each run a few steps of
configs/tiny.yaml through mpiexec and checked for one property, in turn:

  exit    any drawn config (edge values included) ends with 0, or 1 or 2 after an error line (CONTRACT: 2 a bad
          config, 1 a failure while running), within the timeout: no crash, no sanitizer report, no hang, and no
          communicator left alive past MPI_Finalize;
  parity  an fp32 config whose features keep the arithmetic (recomputation, ZeRO, overlap, schedules, sequence and
          context parallelism, ...) on a mesh of 2-8 ranks: every training and validation loss within 1e-5 relative
          of the same config on one rank, in micro-batches of a size drawn apart (the parity tests' tolerance:
          only summation order differs);
  resume  four steps with checkpoints on one mesh, resumed to six on another (and a micro-batch size drawn apart):
          steps 5 and 6 within 1e-5 relative of six uninterrupted steps on the first (docs/reliability.md, "Resume
          and resharding"); a fifth of the draws under local SGD on 2 replicas, resumed on 2 replicas of another
          tp x pp; a third resumed on the same mesh and micro-batch with features that change the arithmetic too
          (bf16 or fp16 compute, bf16 gradient reduction, gradient compression, staleness, local SGD, ...), where
          steps 5 and 6 and the exported weights must equal the uninterrupted run's exactly (the guarantee
          docs/reliability.md gives for the same mesh).
  stop    eight steps on a mesh of 1-4 ranks with run.stop_signals, one rank (or mpiexec) sent SIGTERM after a
          step drawn at random: the run stops with a checkpoint (or completes), and the same command resumes and
          ends bit-identical to an uninterrupted run, metrics rows and export (docs/reliability.md), whatever the
          mesh, schedule and features (those of a same-mesh resume, staleness left out: its stop adds a sync point;
          local SGD every 2-5 steps in three draws of ten, whose stop may fall between averages);
  sample  a few steps on one mesh, then build/sample from the exported weights on one process and split over
          tp x pp ranks, greedy or drawn (temperature, top-k, seed): the same tokens (README, "Sampling"), and no
          communicator left alive past MPI_Finalize.

Drawn configs the trainer refuses (exit 2) are counted, not failures. Each failure is printed with the commands that reproduce it and saved in OUT/failures.json; the
script exits 1 when there is one. Run dirs are kept under OUT only for failures unless --keep.
  /usr/bin/python3 scripts/random_runs.py [--runs 60] [--seed 1] [--checks exit,parity,resume,stop,sample] [--out DIR]
With TRAINER=build-asan/trainer (`cmake --build build-asan --target trainer sample` after scripts/sanitize.sh) the
same draws run under ASan + UBSan (build/sample is taken from beside the trainer). Stdlib only."""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL = 1e-5

# Values for `exit`: the keys most likely to meet each other badly, with edge values.
WILD = {
    "model.n_layer": [1, 2, 3], "model.seq_len": [1, 2, 8, 17], "model.vocab_size": [2, 63, 65, 300],
    "parallel.tp": [1, 2, 4], "parallel.pp": [1, 2, 4], "parallel.cp": [1, 2], "parallel.dp": [0, 1, 2],
    "parallel.schedule": ["gpipe", "1f1b", "zb1", "interleaved"], "parallel.virtual_stages": [1, 2],
    "parallel.stage_layers": ["[1,1]", "[0,2]"], "parallel.sequence_parallel": ["true", "false"],
    "train.global_batch": [1, 4, 8], "train.micro_batch": [1, 2, 4], "train.grad_clip": [0, 1e-9],
    "train.recompute": ["none", "light", "selective", "full"], "train.threads": [0, 1, 3],
    "optim.zero": [0, 1, 2, 3], "optim.name": ["adamw", "sgd"], "optim.sync_every": [0, 2],
    "optim.outer": ["none", "nesterov"], "optim.staleness": [0, 1], "optim.lr": [1e-2, 10.0],
    "precision.compute": ["fp32", "bf16", "fp16"], "precision.grad_reduce": ["fp32", "bf16"],
    "comm.compress": ["none", "bf16", "int8", "topk", "powersgd"], "comm.adapt": ["true", "false"],
    "comm.hierarchical": ["true", "false"], "comm.emulate.ranks_per_node": [0, 2], "comm.wait": ["poll", "block"],
    "comm.backend": ["auto", "mpi", "shm"], "comm.emulate.latency_us": [0, 20], "run.checkpoint_every": [0, 2],
    "run.check_copies_every": [0, 1], "train.straggler.ranks": ["[1]"], "train.straggler.delay_ms": [0, 5],
    "data.order": ["sequential", "shuffle"],
}
# Features that change nothing but summation order (parity, resume), each drawn with probability 0.35.
EXACT = [("train.recompute", ["none", "light", "selective", "full"]), ("optim.zero", [0, 1, 2, 3]),
         ("optim.name", ["adamw", "sgd"]), ("data.order", ["sequential", "shuffle"]), ("comm.overlap", ["true", "false"]),
         ("optim.zero_reduce", ["micro_batch", "step"]), ("optim.zero_unit", ["block", "sublayer"]),
         ("train.cpu_matmul", ["auto", "eigen"]), ("comm.wait", ["auto", "poll"]), ("comm.hierarchical", ["true"]),
         ("run.check_copies_every", [1, 2])]
MESH_ONLY = ("optim.zero", "comm.hierarchical", "comm.emulate.", "parallel.")
# Features a same-mesh resume draws beside those (one to three of them): each changes the arithmetic, none the
# promise that the continued run is bit-identical. Combinations the trainer refuses count as refused.
SAME_MESH = [("precision.compute", ["bf16", "fp16"]), ("precision.grad_reduce", ["bf16"]),
             ("comm.compress", ["bf16", "int8", "topk", "powersgd"]), ("optim.staleness", [1, 2]),
             ("optim.sync_every", [2]), ("optim.outer", ["nesterov"]), ("train.skip_nonfinite", ["true"]),
             ("train.straggler.delay_ms", [2]), ("optim.weight_decay", [0.0])]


def draw_mesh(rnd, ranks):
    while True:
        tp, pp, cp = rnd.choice([1, 2, 4]), rnd.choice([1, 2, 4]), rnd.choice([1, 1, 2])
        if ranks % (tp * pp * cp) == 0:
            break
    mesh = ["parallel.tp=%d" % tp, "parallel.pp=%d" % pp, "parallel.cp=%d" % cp]
    if pp > 1:
        schedule = rnd.choice(["gpipe", "1f1b", "zb1", "interleaved"])
        mesh += ["parallel.schedule=" + schedule] + (["parallel.virtual_stages=2"] if schedule == "interleaved" else [])
    if tp > 1 and rnd.random() < 0.4:
        mesh.append("parallel.sequence_parallel=true")
    return mesh


def draw_model(rnd):
    arch = rnd.choice(["gpt2", "llama"])
    model = ["model.arch=" + arch, "model.n_head=4", "model.d_model=32", "model.n_layer=%d" % rnd.choice([2, 4]),
             "model.seq_len=%d" % rnd.choice([8, 16]), "model.vocab_size=%d" % rnd.choice([64, 65, 96])]
    if arch == "llama":
        model += ["model.n_kv_head=%d" % rnd.choice([1, 2, 4]), "model.tie_embeddings=" + rnd.choice(["true", "false"])]
    return model


class Runner:
    def __init__(self, args):
        self.args = args

    def command(self, ranks, sets, run_dir):
        return ([self.args.mpiexec, "-n", str(ranks)] + [self.args.trainer, "--config", self.args.config] +
                sum([["--set", s] for s in sets + ["run.dir=" + run_dir]], []))

    def run(self, ranks, sets, run_dir):
        """(exit status or "timeout", {("train"|"val", step): loss}, output, command)."""
        os.makedirs(run_dir, exist_ok=True)
        cmd = self.command(ranks, sets, run_dir)
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               timeout=self.args.timeout)
        except subprocess.TimeoutExpired as e:
            subprocess.run(["pkill", "-9", "-f", run_dir])
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return "timeout", {}, out, cmd
        losses = {}
        if p.returncode == 0:
            for line in open(os.path.join(run_dir, "metrics.jsonl")):
                r = json.loads(line)
                for key, kind in (("loss", "train"), ("val_loss", "val")):
                    if key in r and "step" in r:
                        losses[(kind, r["step"])] = r[key]
        return p.returncode, losses, p.stdout, cmd


def worst(a, b, keys):
    return max(abs(a[k] - b[k]) / abs(b[k]) for k in keys) if all(k in a and k in b for k in keys) else float("inf")


def check_exit(runner, rnd, d):
    sets = ["train.steps=4", "run.log_every=1"] + draw_model(rnd)
    for key in rnd.sample(sorted(WILD), rnd.randint(2, 7)):
        sets.append("%s=%s" % (key, rnd.choice(WILD[key])))
    rc, _, out, cmd = runner.run(rnd.choice([1, 2, 4, 8]), sets, d)
    errors = [l for l in out.splitlines() if " error " in l]
    leaked = [l for l in out.splitlines() if "outlived MPI_Finalize" in l]  # comm/comm_util.h
    if leaked:
        return {"why": "exit status %s, but %s" % (rc, leaked[0]), "commands": [cmd], "tail": leaked[:3]}, None
    if rc == 0 or (rc in (1, 2) and errors):
        return None, "exit %s" % rc
    return {"why": "exit status %s%s" % (rc, "" if errors else " without an error line"), "commands": [cmd],
            "tail": out.splitlines()[-5:]}, None


def exact_config(rnd):
    feats = ["%s=%s" % (k, rnd.choice(v)) for k, v in EXACT if rnd.random() < 0.35]
    if "comm.hierarchical=true" in feats:
        feats.append("comm.emulate.ranks_per_node=2")
    common = ["train.steps=6", "run.log_every=1", "train.global_batch=8", "train.micro_batch=%d" % rnd.choice([1, 2]),
              "optim.lr=3e-3", "optim.min_lr=3e-4", "comm.bucket_mb=0.004"]
    return draw_model(rnd) + common, feats


def check_parity(runner, rnd, d):
    base, feats = exact_config(rnd)
    base += ["train.eval_every=3", "train.eval_batches=1"]
    ranks = rnd.choice([2, 4, 4, 8])
    rc, mesh_losses, out, cmd = runner.run(ranks, base + feats + draw_mesh(rnd, ranks), os.path.join(d, "mesh"))
    if rc == 2:
        return None, "refused"
    # One rank takes the global batch in micro-batches of its own size: accumulation, too, only reorders the sums.
    single = [f for f in feats if not f.startswith(MESH_ONLY)] + ["train.micro_batch=%d" % rnd.choice([1, 2, 4, 8])]
    rc1, one_losses, out1, cmd1 = runner.run(1, base + single, os.path.join(d, "one"))
    if rc != 0 or rc1 != 0:
        return {"why": "exit status %s (mesh), %s (one rank)" % (rc, rc1), "commands": [cmd, cmd1],
                "tail": (out if rc else out1).splitlines()[-5:]}, None
    w = worst(mesh_losses, one_losses, list(one_losses))
    if w > RTOL:
        return {"why": "losses %.2e relative from one rank's" % w, "commands": [cmd, cmd1]}, None
    return None, "%.1e" % w


def mesh_dp(ranks, mesh):
    sizes = dict(s.split("=") for s in mesh if s.split("=")[0] in ("parallel.tp", "parallel.pp", "parallel.cp"))
    return ranks // (int(sizes["parallel.tp"]) * int(sizes["parallel.pp"]) * int(sizes["parallel.cp"]))


def check_resume(runner, rnd, d):
    base, feats = exact_config(rnd)
    base = [s for s in base if not s.startswith("train.steps=")] + ["optim.schedule=constant"]  # steps may change
    ranks, ranks2 = rnd.choice([1, 2, 4]), rnd.choice([1, 2, 4])
    mesh, mesh2 = draw_mesh(rnd, ranks), draw_mesh(rnd, ranks2)
    kind, drawn = rnd.choices(["another mesh", "local SGD", "same mesh"], [7, 3, 5])[0], []
    if kind == "local SGD":
        # Local SGD (averages every 2 steps, so the checkpoints of steps 2 and 4 fall on them, as in the 6-step run):
        # each replica resumes its own moments, so the resumed mesh keeps dp (its tp, pp and micro-batch may change;
        # cp needs synchronous replicas).
        feats = [f for f in feats if not f.startswith("optim.zero=")] + [
            "optim.sync_every=2", "optim.outer=" + rnd.choice(["none", "nesterov"])]
        ranks, mesh = 2, ["parallel.tp=1", "parallel.pp=1", "parallel.cp=1"]
        while mesh_dp(ranks2, mesh2) != 2 or "parallel.cp=2" in mesh2:
            ranks2 = rnd.choice([2, 4])
            mesh2 = draw_mesh(rnd, ranks2)
    same = kind == "same mesh"
    if same:
        drawn = ["%s=%s" % (k, rnd.choice(v)) for k, v in rnd.sample(SAME_MESH, rnd.randint(1, 3))]
        if any(f.startswith("optim.staleness") for f in drawn):
            drawn.append("optim.staleness_policy=fixed")  # `newest` applies what timing has completed (staleness.md)
        feats = feats + drawn
        if any(f.startswith(("comm.compress", "optim.staleness", "optim.sync_every")) for f in drawn):
            ranks = rnd.choice([2, 4])  # features of the replicas' exchange: at least 2 replicas
            mesh = draw_mesh(rnd, ranks)
            while mesh_dp(ranks, mesh) < 2:
                mesh = draw_mesh(rnd, ranks)
        ranks2, mesh2 = ranks, mesh
    first = base + feats + mesh + ["run.checkpoint_every=2"]
    rc, _, out, cmd = runner.run(ranks, first + ["train.steps=4"], os.path.join(d, "resumed"))
    if rc == 2:
        return None, "refused"
    # Resumed in micro-batches of another size too: the checkpoint holds the step, not the micro-batch.
    mb2 = [] if same else ["train.micro_batch=%d" % rnd.choice([1, 2, 4])]
    rc2, resumed, out2, cmd2 = (runner.run(ranks2, base + feats + mesh2 + mb2 + ["train.steps=6"],
                                           os.path.join(d, "resumed"))
                                if rc == 0 else (None, {}, "", []))
    if rc2 == 2:
        return None, "refused"
    rc3, straight, out3, cmd3 = runner.run(ranks, first + ["train.steps=6"], os.path.join(d, "straight"))
    if rc != 0 or rc2 != 0 or rc3 != 0 or "resum" not in out2:
        return {"why": "exit status %s, %s (resumed on another mesh), %s (uninterrupted)%s" %
                (rc, rc2, rc3, "" if "resum" in out2 else "; no resume logged"), "commands": [cmd, cmd2, cmd3],
                "tail": (out2 or out).splitlines()[-5:]}, None
    w = worst(resumed, straight, [("train", 5), ("train", 6)])
    if w > (0 if same else RTOL):
        return {"why": "steps 5-6 %.2e relative from the uninterrupted run's" % w, "commands": [cmd, cmd2, cmd3]}, None
    if same and not same_file(os.path.join(d, "resumed", "model.safetensors"),
                              os.path.join(d, "straight", "model.safetensors")):
        return {"why": "the exported weights differ from the uninterrupted run's", "commands": [cmd, cmd2, cmd3]}, None
    return None, "%.1e (%s)" % (w, "same mesh, " + " ".join(drawn) if same else kind)


def same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def rows(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def rank_pids(run_dir):
    """The trainer processes of a run (their command line names its run.dir), mpiexec and its proxies left out."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"trainer" and ("run.dir=" + run_dir).encode() in argv:
            pids.append(int(pid))
    return sorted(pids)


def check_stop(runner, rnd, d):
    base, feats = exact_config(rnd)
    drawn = ["%s=%s" % (k, rnd.choice(v)) for k, v in rnd.sample(SAME_MESH, rnd.randint(0, 2))
             if k not in ("optim.staleness", "optim.sync_every", "train.straggler.delay_ms")]
    ranks = rnd.choice([1, 2, 2, 4])
    if rnd.random() < 0.3:
        # Local SGD's stop reads the vote min(H, 8) steps late and may land between averages, where the checkpoint
        # holds each replica's weights: periods that leave room for that within eight steps.
        feats = [f for f in feats if not f.startswith("optim.zero=")]
        drawn = [f for f in drawn if not f.startswith("comm.compress=")] + [
            "optim.sync_every=%d" % rnd.choice([2, 3, 4, 5])]
        ranks = rnd.choice([2, 4])
    # Rank 0 sleeps about 40 ms before each step, so the signal finds the run mid-step; it changes no arithmetic.
    sets = ([s for s in base if not s.startswith("train.steps=")] + feats + drawn + draw_mesh(rnd, ranks) +
            ["train.steps=8", "run.stop_signals=TERM", "train.straggler.ranks=[0]", "train.straggler.delay_ms=40"])
    stopped_dir, straight_dir = os.path.join(d, "stopped"), os.path.join(d, "straight")
    rc, _, _, cmd = runner.run(ranks, sets, straight_dir)
    if rc == 2:
        return None, "refused"
    local_sgd = any(f.startswith("optim.sync_every=") for f in drawn)  # its stop comes up to H steps late
    after, to_mpiexec = rnd.randint(1, 2 if local_sgd else 6), ranks > 1 and rnd.random() < 0.3
    os.makedirs(stopped_dir, exist_ok=True)
    cmd2 = runner.command(ranks, sets, stopped_dir)
    p = subprocess.Popen(cmd2, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                         start_new_session=True)
    t0 = time.time()
    while len(rows(stopped_dir)) < after and p.poll() is None and time.time() - t0 < runner.args.timeout:
        time.sleep(0.01)
    pids = rank_pids(stopped_dir)
    target = "mpiexec" if to_mpiexec or not pids else "one of %d ranks" % len(pids)
    try:
        os.kill(p.pid if target == "mpiexec" else rnd.choice(pids), signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended first
    try:
        out2, _ = p.communicate(timeout=runner.args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out2 = p.communicate()[0] + "\n(killed: the run did not end)"
    if p.returncode != 0 or rc != 0:
        return {"why": "exit status %s after SIGTERM to %s after %d rows, %s uninterrupted" %
                (p.returncode, target, after, rc), "commands": [cmd2, cmd], "tail": out2.splitlines()[-5:]}, None
    rc3, _, out3, cmd3 = runner.run(ranks, sets, stopped_dir)
    keys = ("step", "loss", "grad_norm", "lr", "tokens")
    resumed = [{k: r.get(k) for k in keys} for r in rows(stopped_dir)]
    if rc3 != 0 or resumed != [{k: r.get(k) for k in keys} for r in rows(straight_dir)]:
        return {"why": "the resumed run (exit %s) differs from the uninterrupted one, after SIGTERM to %s" %
                (rc3, target), "commands": [cmd2, cmd3, cmd], "tail": out3.splitlines()[-5:]}, None
    if not same_file(os.path.join(stopped_dir, "model.safetensors"), os.path.join(straight_dir, "model.safetensors")):
        return {"why": "the export after the stop and resume differs from the uninterrupted run's",
                "commands": [cmd2, cmd3, cmd]}, None
    at = [l.split("after step ")[1].split()[0] for l in out2.splitlines() if "stopped by SIGTERM after step" in l]
    return None, ("stopped after step %s" % at[0] if at else "completed") + \
        " (SIGTERM to %s after %d rows%s)" % (target, after, ", " + " ".join(drawn) if drawn else "")


def check_sample(runner, rnd, d):
    base, feats = exact_config(rnd)
    ranks = rnd.choice([1, 2, 4])
    base = [x for x in base if not x.startswith("train.steps=")] + ["train.steps=3"]
    rc, _, out, cmd = runner.run(ranks, base + feats + draw_mesh(rnd, ranks), d)
    if rc == 2:
        return None, "refused"
    if rc != 0:
        return {"why": "training exit status %s" % rc, "commands": [cmd], "tail": out.splitlines()[-5:]}, None
    sample = os.path.join(os.path.dirname(runner.args.trainer), "sample")
    flags = ["--run", d, "--prompt-ids", "1,2,3", "--tokens", "10", "--ids", "--seed", str(rnd.randint(1, 99)),
             "--temperature", rnd.choice(["0", "0.8"]), "--top-k", rnd.choice(["0", "5"])]
    tp, pp = rnd.choice([1, 2, 4]), rnd.choice([1, 2])
    one = [sample] + flags
    split = [runner.args.mpiexec, "-n", str(tp * pp), sample, "--tp", str(tp), "--pp", str(pp)] + flags
    results = [subprocess.run(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                              timeout=runner.args.timeout) for c in (one, split)]
    if results[1].returncode == 2 and results[0].returncode == 0:
        return None, "refused"  # a split that does not fit the model (tp over the heads, pp over the layers)
    leaked = "outlived MPI_Finalize" in results[1].stderr
    if any(r.returncode != 0 for r in results) or results[0].stdout != results[1].stdout or leaked:
        return {"why": "sampling exit status %s (one process), %s (tp %d x pp %d)%s%s" %
                (results[0].returncode, results[1].returncode, tp, pp,
                 "; different tokens" if results[0].stdout != results[1].stdout else "",
                 "; a communicator outlived MPI_Finalize" if leaked else ""),
                "commands": [cmd, one, split],
                "tail": [l for r in results for l in (r.stdout + r.stderr).splitlines()[-3:]]}, None
    return None, "the same %d tokens (tp %d x pp %d)" % (len(results[0].stdout.split()) - 3, tp, pp)


CHECKS = {"exit": check_exit, "parity": check_parity, "resume": check_resume, "stop": check_stop,
          "sample": check_sample}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=60, help="draws (each checks one property, in turn)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "random"))
    ap.add_argument("--trainer", default=os.environ.get("TRAINER", os.path.join(ROOT, "build", "trainer")))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny.yaml"))
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--timeout", type=float, default=180, help="seconds a run may take before it counts as a hang")
    ap.add_argument("--keep", action="store_true", help="keep every run dir, not only the failures'")
    args = ap.parse_args()
    checks = args.checks.split(",")
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or args.runs < 1:
        sys.exit("random_runs: --checks takes %s (got %s); --runs at least 1" % (",".join(CHECKS), args.checks))
    runner, failures, counts = Runner(args), [], {}
    for i in range(args.runs):
        check = checks[i % len(checks)]
        rnd = random.Random("%d/%d" % (args.seed, i))  # each draw reproducible on its own
        d = os.path.join(args.out, "%04d_%s" % (i, check))
        shutil.rmtree(d, ignore_errors=True)
        failure, verdict = CHECKS[check](runner, rnd, d)
        outcome = "failed" if failure else "refused" if verdict == "refused" else "ok"
        counts.setdefault(check, {}).setdefault(outcome, 0)
        counts[check][outcome] += 1
        print("%4d %-6s %s" % (i, check, "FAILED: " + failure["why"] if failure else verdict), flush=True)
        if failure:
            failure.update(draw=i, seed=args.seed, check=check, dir=d)
            failures.append(failure)
            for c in failure["commands"]:
                print("       " + " ".join(c))
        elif not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "failures.json"), "w") as f:
        json.dump(failures, f, indent=1)
    print("random_runs: " + "; ".join("%s %s" % (c, ", ".join("%d %s" % (n, k) for k, n in sorted(v.items())))
                                      for c, v in counts.items()) + " (seed %d)" % args.seed)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
