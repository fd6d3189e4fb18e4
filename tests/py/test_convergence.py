"""The default config (configs/gpt.yaml, synthetic corpus) learns: its first loss is ln(V) within 2% (the
initial weights are small, so the first prediction is near uniform), and its final loss lands within 10% of
the corpus's entropy rate (the best loss any model can reach), as issue #2 asks. The final loss is the
validation loss of the last step (8 global batches of held-out tokens: less noisy than one training batch). Standard library only.
Usage: test_convergence.py TRAINER SOURCE_DIR WORK_DIR [--set ...]"""
import json
import math
import os
import re
import subprocess
import sys

trainer, src, work = sys.argv[1:4]
run_dir = os.path.join(work, "run")
cmd = [trainer, "--config", os.path.join(src, "configs", "gpt.yaml"), "--set", f"run.dir={run_dir}"] + sys.argv[4:]
r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
print(r.stdout + r.stderr)
assert r.returncode == 0, f"trainer exited with {r.returncode}"
m = re.search(r"entropy rate\) ([0-9.]+) nats", r.stdout + r.stderr)
assert m, "the log does not state the corpus's entropy rate"
entropy = float(m.group(1))
rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
vocab = int(re.search(r"vocab_size: (\d+)", open(os.path.join(run_dir, "config.yaml")).read()).group(1))
first = rows[0]["loss"]
assert "val_loss" in rows[-1], "the last step has no validation loss (train.eval_every)"
last = rows[-1]["val_loss"]
print(f"first loss {first:.4f} (ln V = {math.log(vocab):.4f}), final validation loss {last:.4f}, entropy rate {entropy:.4f}, "
      f"ratio {last / entropy:.3f}")
assert abs(first - math.log(vocab)) < 0.02 * math.log(vocab), "the first loss is not ln(V)"
assert last <= 1.10 * entropy, f"final loss {last:.4f} is not within 10% of the entropy rate {entropy:.4f}"
assert last >= entropy * 0.97, "the loss fell below the entropy rate: the loss or the corpus is wrong"
for name in ("model.safetensors", "config.json", "config.yaml"):
    assert os.path.exists(os.path.join(run_dir, name)), f"{name} was not written"
print("ok")
