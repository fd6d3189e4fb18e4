"""The export checked in the client its users load it with: Hugging Face transformers. For a tiny GPT-2 (tied head)
and two tiny Llamas (grouped-query attention with an untied head; one kv head with a tied head, and non-default
rope_theta and rms_norm_eps), meshtrain trains a few steps on one rank and exports run.dir/model.safetensors and
config.json; GPT2LMHeadModel / LlamaForCausalLM.from_pretrained(run.dir) loads the folder as a user would (every
tensor used, none missing, none left over), and its mean cross-entropy in float64 on a fixed batch must equal
meshtrain's loss of the exported weights on the same batch within 1e-5 relative.

meshtrain's loss: the run's evaluation after its last step, with the token file this test writes as validation
data (data.val_path, one global batch: windows o = g * seq_len, g < global_batch, inputs tokens[o .. o+T-1], targets
tokens[o+1 .. o+T], the README's data semantics), is the mean cross-entropy of the very weights the run then
exports, computed from memory: so the exporter is checked against transformers' reading of the file, not
meshtrain's importer against it. Tolerance: fp32 (meshtrain) against fp64 (transformers) on a model this small
differs by ~1e-8; a wrong tensor, layout or config field moves the loss by far more than 1e-5.

transformers comes from the Python package registry: this interpreter's if it has it, otherwise the venv of
scripts/hf_venv.sh (created on the first run, reused after). Where that cannot be had (no network, no torch for the
base interpreter, no venv module) the test says why and exits 77, which CTest reports as skipped.
Usage: test_hf_export.py TRAINER SOURCE_DIR WORK_DIR
"""
import json
import os
import subprocess
import sys
import time

from hf_support import rerun_in_hf_venv_or_skip

LOSS_RTOL = 1e-5

CASES = [
    ("gpt2", "GPT2LMHeadModel",
     {"model.arch": "gpt2", "model.n_layer": 2, "model.n_head": 4, "model.d_model": 64}),
    ("llama_gqa", "LlamaForCausalLM",
     {"model.arch": "llama", "model.n_layer": 2, "model.n_head": 4, "model.n_kv_head": 2, "model.d_model": 64,
      "model.ffn_hidden": 0, "model.multiple_of": 32, "model.tie_embeddings": "false"}),
    ("llama_tied", "LlamaForCausalLM",
     {"model.arch": "llama", "model.n_layer": 2, "model.n_head": 4, "model.n_kv_head": 1, "model.d_model": 64,
      "model.ffn_hidden": 96, "model.tie_embeddings": "true", "model.rope_theta": 500000,
      "model.norm_eps": 1e-3}),
]
SEQ_LEN, VOCAB, EVAL_BATCH, STEPS = 32, 250, 8, 6  # vocab 250: padded to 256 inside, so the export must unpad


def transformers_or_skip(src):
    """Returns the transformers module, after re-running this script under scripts/hf_venv.sh's python if this
    interpreter lacks it; exits 77 (skipped) when neither has it."""
    try:
        import importlib.util
        if importlib.util.find_spec("transformers") is None:  # no torch import (seconds) for nothing
            raise ImportError("No module named 'transformers'")
        import torch  # noqa: F401
        import transformers
        from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401
        from transformers.utils import is_torch_available
        if not is_torch_available():  # a transformers newer than this torch imports, with its models disabled
            raise ImportError(f"transformers {transformers.__version__} disabled PyTorch {torch.__version__}")
        return transformers
    except Exception as e:  # ImportError, or a torch / numpy mismatch raised while importing
        rerun_in_hf_venv_or_skip(src, f"{sys.executable} cannot import torch and transformers ({type(e).__name__}: {e})")


def run_trainer(trainer, src, run_dir, sets):
    """Runs the trainer on one rank; returns the rows of metrics.jsonl."""
    cmd = [trainer, "--config", os.path.join(src, "configs", "tiny.yaml")]
    for k, v in dict(sets, **{"run.dir": run_dir}).items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: the trainer exited with {r.returncode}: {' '.join(cmd)}")
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def run_case(name, cls_name, model_sets, trainer, src, work, token_path, tokens):
    import numpy as np
    import torch
    import transformers

    # The last step's evaluation reads the token file as validation data (one global batch: windows g * seq_len)
    # with the weights the run then exports. init_std 0.2 (not 0.02): attention and the norms then matter after a
    # few steps, so a misplaced tensor or config field shows in the loss (measured: rope_theta 10000 for 500000
    # moves it 1.3e-2, rms_norm_eps 1e-5 for 1e-3 1.2e-4, ln_1 and ln_2 swapped 4.5e-4, a head's rotary halves
    # interleaved 1.6e-4; with 0.02 some of these stayed under 1e-5).
    run_dir = os.path.join(work, name)
    sets = {"model.seq_len": SEQ_LEN, "model.vocab_size": VOCAB, "model.init_std": 0.2, "data.source": "tokens",
            "data.path": token_path, "data.val_path": token_path, "data.val_fraction": 0,
            "precision.compute": "fp32", "train.steps": STEPS, "train.global_batch": EVAL_BATCH,
            "train.micro_batch": EVAL_BATCH // 2, "train.eval_every": STEPS, "train.eval_batches": 1,
            "optim.lr": 1e-2, "optim.warmup_steps": 1, "run.log_every": 100}
    rows = run_trainer(trainer, src, run_dir, dict(model_sets, **sets))
    train = [row["loss"] for row in rows]
    ours = rows[-1]["val_loss"]

    # As a user loads it: the folder holding config.json and model.safetensors.
    cls = getattr(transformers, cls_name)
    model, info = cls.from_pretrained(run_dir, output_loading_info=True)
    ok = True
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(k):
            print(f"FAIL {name}: from_pretrained {k}: {info[k]}")
            ok = False
    # GPT-2's GELU is the tanh approximation (gelu_new): exact GELU in its place moves this tiny model's loss by
    # only ~2e-7 (measured), under what the loss can show, so the config field is checked by name.
    if cls_name == "GPT2LMHeadModel" and model.config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        print(f"FAIL {name}: config.json's activation_function is {model.config.activation_function}, not gelu_new")
        ok = False
    model = model.double().eval()
    T = SEQ_LEN
    x = np.stack([tokens[g * T:g * T + T] for g in range(EVAL_BATCH)]).astype(np.int64)
    y = np.stack([tokens[g * T + 1:g * T + T + 1] for g in range(EVAL_BATCH)]).astype(np.int64)
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(x)).logits
        hf = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               torch.from_numpy(y).reshape(-1)).item()
    rel = abs(hf - ours) / abs(ours)
    ok &= rel <= LOSS_RTOL and train[-1] < train[0] - 1  # and the export is of a trained model, not of its init
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {cls_name} loss {hf:.9f}, meshtrain {ours:.9f}, relative difference "
          f"{rel:.2e} (tolerance {LOSS_RTOL:g}); trained {len(train)} steps, training loss {train[0]:.4f} -> "
          f"{train[-1]:.4f}")
    return ok


def main():
    trainer, src, work = (os.path.abspath(a) for a in sys.argv[1:4])
    t0 = time.time()
    transformers = transformers_or_skip(src)
    import numpy as np
    import torch
    print(f"transformers {transformers.__version__}, torch {torch.__version__} ({sys.executable})")
    torch.set_num_threads(1)
    os.makedirs(work, exist_ok=True)
    raw = np.frombuffer(open(os.path.join(src, "data", "tinyshakespeare.txt"), "rb").read()[:20_000], dtype=np.uint8)
    tokens = raw.astype(np.int64) % VOCAB
    token_path = os.path.join(work, "tokens.bin")  # raw little-endian uint16 (nanoGPT's .bin)
    tokens.astype("<u2").tofile(token_path)
    ok = True
    for name, cls_name, sets in CASES:
        ok &= run_case(name, cls_name, sets, trainer, src, work, token_path, tokens)
    print(f"{'PASS' if ok else 'FAIL'} ({time.time() - t0:.1f} s)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
