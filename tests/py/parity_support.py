"""Shared pieces of the parallel-layout parity tests: running the trainer through mpiexec, reading its
safetensors output, and the gradient comparison. Standard library only."""
import json
import os
import struct
import subprocess


def run_trainer(mpiexec, trainer, ranks, args, run_dir, timeout=300):
    """Runs the trainer on `ranks` ranks (one compute thread each) into run_dir; returns (losses, log text)."""
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [trainer] + list(args) + ["--set", f"run.dir={run_dir}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {os.path.basename(run_dir)} exited with {r.returncode}: {' '.join(cmd)}")
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return losses, r.stdout + r.stderr


def run_mesh(mpiexec, trainer, base, run_dir, dp, tp, pp, sets=(), grads=False, cp=1):
    """Runs `base` args on a dp x tp x pp (x cp) mesh (extra --set `sets`; `grads`: dump the step-1 gradients).
    Returns the training losses followed by the validation losses (compared alike), the log, the exported model and
    the dumped gradients (or None)."""
    args = list(base) + ["--set", f"parallel.dp={dp}", "--set", f"parallel.tp={tp}", "--set", f"parallel.pp={pp}",
                         "--set", f"parallel.cp={cp}"]
    for s in sets:
        args += ["--set", s]
    grads_path = os.path.join(run_dir, "grads.safetensors")
    if grads:
        args += ["--set", f"run.dump_grads={grads_path}"]
    losses, log = run_trainer(mpiexec, trainer, dp * tp * pp * cp, args, run_dir)
    losses += [json.loads(line)["val_loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))
               if "val_loss" in line]
    weights = read_safetensors(os.path.join(run_dir, "model.safetensors"))
    return losses, log, weights, (read_safetensors(grads_path) if grads else None)


def read_safetensors(path):
    """name -> (shape tuple, flat tuple of floats), F32 only."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = (tuple(info["shape"]), struct.unpack(f"<{(e - b) // 4}f", data[b:e]))
    return out


def max_relative_loss_difference(losses, ref_losses):
    if len(losses) != len(ref_losses):
        return float("inf")
    return max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))


def compare_grads(name, grads, ref_grads, rtol):
    """Every tensor's ||g - g_ref|| / ||g_ref|| must be <= rtol, with the same names and shapes."""
    if sorted(grads) != sorted(ref_grads):
        print(f"FAIL {name}: dumped gradient names differ: {sorted(set(grads) ^ set(ref_grads))}")
        return False
    worst, worst_name, ok = 0.0, "", True
    for k, (shape, vals) in grads.items():
        rshape, rvals = ref_grads[k]
        if shape != rshape:
            print(f"FAIL {name}: gradient {k} has shape {shape}, the single-rank run {rshape}")
            ok = False
            continue
        diff = sum((a - b) ** 2 for a, b in zip(vals, rvals)) ** 0.5
        norm = sum(b * b for b in rvals) ** 0.5
        rel = diff / norm if norm > 0 else diff
        if rel > worst:
            worst, worst_name = rel, k
    ok &= worst <= rtol
    print(f"{'ok  ' if ok else 'FAIL'} {name} step-1 gradients: {len(grads)} tensors, worst relative difference "
          f"{worst:.2e} ({worst_name})")
    return ok


def max_weight_difference(weights, ref_weights):
    """Largest absolute difference over all tensors; inf when names or shapes differ."""
    if sorted(weights) != sorted(ref_weights):
        return float("inf")
    worst = 0.0
    for k, (shape, vals) in weights.items():
        rshape, rvals = ref_weights[k]
        if shape != rshape:
            return float("inf")
        worst = max(worst, max(abs(a - b) for a, b in zip(vals, rvals)))
    return worst
