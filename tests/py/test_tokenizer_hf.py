"""build/sample's GPT-2 tokenizer (src/data/bpe_tokenizer.cpp) against Hugging Face's tokenizers, the library
GPT-2's tokenizer files are made with and read by. A byte-level BPE of 1500 tokens (with <|endoftext|>) is trained
on a part of tinyshakespeare and the texts below and saved both ways (tokenizer.json; vocab.json with merges.txt); `sample --encode` must give
tokenizers' ids for every text below with either file: 40 random passages of the corpus and texts that exercise
the pre-tokenizer (contractions, runs of whitespace, digits, punctuation, letters and numbers of other scripts,
the special token). `sample --decode` must give back each text from those ids.

tokenizers comes from the Python package registry through scripts/hf_venv.sh's venv (it comes with
transformers); where that cannot be had the test says why and exits 77, which CTest reports as skipped.
Usage: test_tokenizer_hf.py SAMPLE SOURCE_DIR WORK_DIR
"""
import os
import random
import shutil
import subprocess
import sys

from hf_support import rerun_in_hf_venv_or_skip

SAMPLE, SRC, WORK = sys.argv[1:4]
try:
    from tokenizers import ByteLevelBPETokenizer
except ImportError as e:
    rerun_in_hf_venv_or_skip(SRC, f"{sys.executable} cannot import tokenizers ({e})")

TEXTS = [
    "ROMEO: I'll go, don't you?  Yes!\n\nNo.",
    "they're we've I'm he'd you'll 'tis O'ER ''s",
    "a  b   c\t\td \n e\n\n\nf   ",
    "  leading spaces, trailing spaces   ",
    "123 4567 3.14 1,000,000 x2 2x",
    "caf\u00e9 na\u00efve \uff14\uff15 \u2014 \u00abquoted\u00bb \u65e5\u672c\u8a9e \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0661\u0662",
    "e\u0301 combining, \u00a0no-break\u2003em space\u3000ideographic",
    "emoji \U0001F600\U0001F680 and symbols \u00a9\u00ae\u2122 $5 #tag @user",
    "before<|endoftext|>after <|endoftext|> end",
    "",
]


def sample(*args):
    r = subprocess.run([SAMPLE] + list(args), capture_output=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {SAMPLE} {' '.join(args[:3])}... exited {r.returncode}: {r.stderr.decode()}")
    return r.stdout


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    corpus_path = os.path.join(SRC, "data", "tinyshakespeare.txt")
    # The texts below are in the training data too, so that merges join the bytes of other scripts' letters and
    # numbers: a piece cut in the wrong place then gives other ids.
    corpus = open(corpus_path, encoding="utf-8").read()
    training = os.path.join(WORK, "training.txt")
    with open(training, "w", encoding="utf-8") as f:
        f.write(corpus[:100000] + "\n".join(TEXTS * 50))
    t = ByteLevelBPETokenizer()
    t.train([training], vocab_size=1500, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    t.save(os.path.join(WORK, "tokenizer.json"))
    t.save_model(WORK)  # vocab.json and merges.txt

    rng = random.Random(1)
    texts = list(TEXTS)
    for _ in range(40):
        at, n = rng.randrange(len(corpus) - 400), rng.randrange(1, 400)
        texts.append(corpus[at:at + n])

    failures = 0
    for text in texts:
        want = t.encode(text).ids
        for f in ("tokenizer.json", "vocab.json"):
            got = [int(x) for x in sample("--tokenizer", os.path.join(WORK, f), "--encode", text).split()]
            if got != want:
                failures += 1
                print(f"FAIL {f}: {text!r}\n  tokenizers {want}\n  meshtrain  {got}")
        back = sample("--tokenizer", os.path.join(WORK, "tokenizer.json"), "--decode",
                      ",".join(map(str, want))).decode("utf-8")[:-1]  # less the newline
        if back != text or t.decode(want, skip_special_tokens=False) != text:
            failures += 1
            print(f"FAIL decode: {text!r} came back as {back!r}")
    print(f"{'FAIL' if failures else 'PASS'}: {len(texts)} texts through both tokenizer files, {failures} differed "
          f"from tokenizers' ids or did not decode back")
    return 1 if failures else 0


sys.exit(main())
