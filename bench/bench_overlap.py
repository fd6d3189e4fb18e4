"""Overlap of the data-parallel gradient all-reduce with the backward pass, on an emulated network (issue #3,
performance (a)).

Two data-parallel ranks train configs/gpt.yaml with one micro-batch per rank on a link emulated so that the
gradient all-reduce takes about as long as the backward pass. For overlap off and on, and a sweep of
comm.bucket_mb, it prints the median step_ms, comm_ms and exposed_comm_ms of steps 6..N from metrics.jsonl,
the exposed share (exposed / comm) and the step time against the non-overlapped run measured in the same
session; with matplotlib available it also draws the sweep into a PNG.

Usage: /usr/bin/python3 bench/bench_overlap.py [--bandwidth-gbps 0.16] [--latency-us 20] [--steps 25]
                                                [--plot docs/figures/bucket_sweep.png] [--comm-wait auto|poll|block]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(bucket_mb, overlap, args, work):
    run_dir = os.path.join(work, f"b{bucket_mb}_{overlap}")
    cmd = ["mpiexec", "-n", "2", os.path.join(ROOT, "build", "trainer"), "--config",
           os.path.join(ROOT, "configs", "gpt.yaml"), "--set", "parallel.dp=2", "--set", "train.global_batch=16",
           "--set", "train.micro_batch=8", "--set", f"train.steps={args.steps}", "--set", "train.eval_every=0",
           "--set", f"comm.bucket_mb={bucket_mb}", "--set", f"comm.overlap={'true' if overlap else 'false'}",
           "--set", f"comm.emulate.bandwidth_gbps={args.bandwidth_gbps}",
           "--set", f"comm.emulate.latency_us={args.latency_us}", "--set", "run.log_every=1000",
           "--set", f"run.dir={run_dir}"]
    cmd += ["--set", f"comm.wait={args.comm_wait}"]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][5:]
    med = lambda k: statistics.median(r[k] for r in rows)
    return med("step_ms"), med("comm_ms"), med("exposed_comm_ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bandwidth-gbps", type=float, default=0.16)
    ap.add_argument("--latency-us", type=float, default=20)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--buckets", default="0.1,0.25,0.5,1,2,25")
    ap.add_argument("--plot", default="")
    ap.add_argument("--comm-wait", default="auto", help="comm.wait for the runs: auto | poll | block")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        base_step, base_comm, base_exp = run(25, False, args, work)
        print(f"emulated link: {args.latency_us} us, {args.bandwidth_gbps} GB/s; 2 ranks, 1 thread each; "
              f"comm.wait={args.comm_wait}")
        print(f"{'bucket_mb':>9} {'overlap':>7} {'step_ms':>8} {'comm_ms':>8} {'exposed':>8} {'exposed/comm':>12} "
              f"{'step vs no overlap':>18}")
        print(f"{25:>9} {'off':>7} {base_step:8.1f} {base_comm:8.1f} {base_exp:8.1f} {base_exp / base_comm:12.2f} "
              f"{1.0:18.2f}")
        sweep = []
        for b in [float(x) for x in args.buckets.split(",")]:
            step, comm, exp = run(b, True, args, work)
            sweep.append((b, step, comm, exp))
            print(f"{b:>9} {'on':>7} {step:8.1f} {comm:8.1f} {exp:8.1f} {exp / comm:12.2f} {step / base_step:18.2f}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.6))
        bs = [s[0] for s in sweep]
        ax.plot(bs, [s[1] for s in sweep], "o-", label="step_ms (overlap on)")
        ax.plot(bs, [s[3] for s in sweep], "s-", label="exposed_comm_ms")
        ax.axhline(base_step, color="gray", ls="--", label="step_ms, overlap off")
        ax.set_xscale("log")
        ax.set_xlabel("comm.bucket_mb")
        ax.set_ylabel("ms per step (median)")
        ax.set_title(f"dp=2, emulated {args.bandwidth_gbps} GB/s, {args.latency_us} us")
        ax.legend(fontsize=8)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
