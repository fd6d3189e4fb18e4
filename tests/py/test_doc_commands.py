#!/usr/bin/env python3
"""The trainer commands in README.md and docs/*.md name layouts that start: for every `mpirun -np N build/trainer
--config C [--set K=V]...` and every `scripts/sweep.py --config C --np LIST [--grid K=A,B]... [--point "..."]...
[--set K=V]...`, each point's ranks equal dp x tp x pp x cp and its global batch divides by dp x micro-batch (what
the trainer checks first, and what three README commands missed: they stopped with exit 2 at 4 ranks).

Usage: test_doc_commands.py SRC. Standard library only (the configs are two-level YAML: `section:` then `  key: value`).
"""
import glob
import itertools
import os
import re
import shlex
import sys

KEYS = ("parallel.dp", "parallel.tp", "parallel.pp", "parallel.cp", "train.global_batch", "train.micro_batch")


def read_config(path):
    """The integer keys above from a two-level YAML config."""
    out, section = {}, None
    for line in open(path):
        line = line.split("#", 1)[0].rstrip()
        m = re.match(r"^(\w+):\s*$", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^\s+(\w+):\s*(\S+)$", line)
        if m and section and "%s.%s" % (section, m.group(1)) in KEYS:
            out["%s.%s" % (section, m.group(1))] = int(m.group(2))
    return out


def problem(world, values):
    """Why a point with these keys cannot start on `world` ranks, or None."""
    tp, pp, cp = values.get("parallel.tp", 1), values.get("parallel.pp", 1), values.get("parallel.cp", 1)
    dp = values.get("parallel.dp", 0) or world // (tp * pp * cp)
    gb, mb = values["train.global_batch"], values["train.micro_batch"]
    if dp * tp * pp * cp != world:
        return "dp %d x tp %d x pp %d x cp %d is not %d ranks" % (dp, tp, pp, cp, world)
    if gb % (dp * mb):
        return "global_batch %d does not divide by dp %d x micro_batch %d" % (gb, dp, mb)
    return None


def sets_of(words, flag):
    """The value after each `flag`."""
    return [words[i + 1] for i in range(len(words) - 1) if words[i] == flag]


def points(words):
    """(world, {key: value}) for every point a command runs, or [] when it is none of the two kinds."""
    # Placeholders (`--config CONFIG`, `...`) and inline code that Markdown wraps mid-command are not commands.
    if "--config" not in words or "..." in words or words[-1].startswith("--"):
        return []
    config = os.path.join(SRC, words[words.index("--config") + 1])
    if not os.path.isfile(config):
        return []
    base = read_config(config)
    overrides = dict(s.split("=", 1) for s in sets_of(words, "--set") if s.split("=", 1)[0] in KEYS)
    base.update({k: int(v) for k, v in overrides.items()})
    if "build/trainer" in words and words[0] in ("mpirun", "mpiexec"):
        return [(int(words[2]), base)]
    if words[0] != "scripts/sweep.py" or "--np" not in words:
        return []
    worlds = [int(n) for n in words[words.index("--np") + 1].split(",")]
    grids = [(k, v.split(",")) for k, v in (g.split("=", 1) for g in sets_of(words, "--grid")) if k in KEYS]
    variants = [dict(zip([k for k, _ in grids], combo)) for combo in itertools.product(*[v for _, v in grids])]
    given = [dict(s.split("=", 1) for s in p.split()) for p in sets_of(words, "--point")]
    variants = [dict(v, **{k: x for k, x in p.items() if k in KEYS}) for v in variants for p in (given or [{}])]
    return [(n, dict(base, **{k: int(x) for k, x in v.items()})) for n in worlds for v in variants]


def commands(text):
    """Each shell line of a Markdown text (continuations joined, comments cut), split into words."""
    text = text.replace("\\\n", " ")
    for line in text.split("\n"):
        line = line.strip().strip("`").split("  #", 1)[0]
        start = re.search(r"\b(mpirun|mpiexec) .*build/trainer|scripts/sweep\.py", line)
        if not start:
            continue
        try:
            yield shlex.split(line[start.start():].split("`", 1)[0])
        except ValueError:  # an unbalanced quote: prose, not a command
            continue


def main():
    failures, checked = [], 0
    for path in [os.path.join(SRC, "README.md")] + sorted(glob.glob(os.path.join(SRC, "docs", "*.md"))):
        for words in commands(open(path).read()):
            for world, values in points(words):
                checked += 1
                why = problem(world, values)
                if why:
                    failures.append("%s: %s: %s" % (os.path.relpath(path, SRC), " ".join(words)[:160], why))
    # The check itself: the README line that stopped with exit 2 before it was fixed is caught.
    broken = list(commands("mpirun -np 4 build/trainer --config configs/gpt.yaml --set optim.zero=3 "
                           "--set model.n_layer=12\n"))
    caught = [problem(w, v) for words in broken for w, v in points(words)]
    # More than 20 points: the docs hold about 60, so a parser that stopped finding commands fails instead of passing.
    ok = checked > 20 and not failures and caught and all(caught)
    for f in failures:
        print("FAIL " + f)
    print("%s  %d points of the trainer and sweep commands in README.md and docs/*.md start (global batch, ranks); "
          "a known-bad line is caught: %s" % ("ok" if ok else "FAIL", checked, caught))
    sys.exit(0 if ok else 1)


SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __name__ == "__main__":
    main()
