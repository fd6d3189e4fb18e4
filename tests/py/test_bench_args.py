"""The benchmarks refuse a bad command line: a misspelt option, a missing value, a number that is not one or is
out of range, too few ranks. Each must exit 2 at once with a line naming the problem, never run something other
than what was asked (atoi's 0), abort or hang. Nothing is timed; every case ends before any measurement starts.
The C++ benches (BENCH_DIR, the build's) parse through bench/bench_args.h, the Python ones (the source tree's bench/)
through bench/bench_cli.py's argparse types.

usage: test_bench_args.py MPIEXEC BENCH_DIR"""
import os
import subprocess
import sys

mpiexec, bench = sys.argv[1:3]
SRC_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
ok = True

# (ranks, 0 for no mpiexec; -1 for a Python bench), bench, arguments, a word the message must contain
CASES = [
    (0, "bench_matmul", ["x"], "usage"),
    (0, "bench_matmul", ["2", "0"], "usage"),
    (0, "bench_matmul", ["1", "2", "3"], "usage"),
    (0, "bench_isa_peak", ["x"], "usage"),
    (0, "bench_isa_peak", ["0"], "usage"),
    (0, "bench_ops", ["0"], "usage"),
    (0, "bench_ops", ["2", "0.1", "C"], "usage"),
    (0, "bench_ops", ["2", "0.1", "A", "fp16"], "usage"),
    (1, "bench_allreduce", ["--max-mib", "0"], "bad value for --max-mib"),
    (1, "bench_allreduce", ["--transport", "x"], "--transport must be"),
    (1, "bench_allreduce", ["--bogus", "1"], "unknown option --bogus"),
    (1, "bench_allreduce", ["--max-mib"], "missing value"),
    (2, "bench_hierarchical", ["--reps", "7x"], "bad value for --reps"),
    (2, "bench_hierarchical", ["--links", "1,2,3"], "--links takes four numbers"),
    (2, "bench_hierarchical", ["--links", "1,2,3,4", "--sizes", "4Q"], "bad --sizes entry"),
    (2, "bench_link", ["--iters"], "bad argument --iters"),
    (2, "bench_link", ["--bytes", "1e3x"], "bad argument --bytes"),
    (1, "bench_pipeline", [], "needs at least 2 ranks"),
    (2, "bench_pipeline", ["--steps", "0"], "bad value for --steps"),
    (2, "bench_pipeline", ["--micro-batches", "4,,8"], "bad --micro-batches entry"),
    (2, "bench_pipeline", ["--pin", "2"], "bad value for --pin"),
    (2, "bench_pipeline", ["--layers", "6"], "--layers must be a multiple of 2p"),
    (2, "bench_pipeline", ["--recompute", "some"], "--recompute must be none, light, selective or full"),
    (-1, "bench_overlap.py", ["--runs", "0"], "argument --runs: must be >= 1"),
    (-1, "bench_overlap.py", ["--buckets", "0.25,x"], "argument --buckets: not a number"),
    (-1, "bench_compress.py", ["--methods", "int4"], "argument --methods: unknown int4"),
    (-1, "bench_local_sgd.py", ["--every", "4,0"], "argument --every: must be >= 1"),
    (-1, "bench_local_sgd.py", ["--delay-ms", "-1"], "argument --delay-ms: must be >= 0"),
    (-1, "bench_time_to_loss.py", ["--target", "-1"], "argument --target: must be > 0"),
    (-1, "bench_zero.py", ["--runs", "0"], "argument --runs: must be >= 1"),
    (-1, "bench_zero.py", ["--dp", "2,1"], "argument --dp: must be >= 2"),
    (-1, "bench_zero.py", ["--micro-batches", "x"], "argument --micro-batches: not an integer"),
    (-1, "bench_cp.py", ["--cp", "1,0"], "argument --cp: must be >= 1"),
    (-1, "bench_cp.py", ["--cp", "4", "--seq-len", "12"], "must be divisible by 2 x cp = 8"),
    (-1, "bench_vs_pytorch.py", ["--cpu-matmul", "blas"], "argument --cpu-matmul: unknown blas"),
    (-1, "bench_vs_pytorch.py", ["--runs", "0"], "argument --runs: must be >= 1"),
    (-1, "bench_copies_check.py", ["--ranks", "1"], "argument --ranks: must be >= 2"),
    (1, "bench_flight_recorder", ["--ops", "0"], "bad value for --ops"),
    (1, "bench_flight_recorder", ["--bogus", "1"], "unknown option --bogus"),
]

for ranks, name, args, want in CASES:
    exe = os.path.join(SRC_BENCH if ranks < 0 else bench, name)
    if not os.path.exists(exe):  # bench_matmul is built only where OpenBLAS is
        print(f"skip {name}: not built")
        continue
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 0 else [sys.executable] if ranks < 0 else []) + [exe] + args
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        out = r.stdout + r.stderr
        good = r.returncode == 2 and want in out
        detail = f"exit {r.returncode}"
    except subprocess.TimeoutExpired:
        good, out, detail = False, "", "timed out"
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {' '.join(cmd[-len(args) - 1:])}: {detail}, expects '{want}'", flush=True)
    if not good:
        print(out[-2000:])

sys.exit(0 if ok else 1)
