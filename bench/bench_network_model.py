#!/usr/bin/env python3
"""The alpha-beta network model against a real network (issue #19; docs/multinode.md).

Makes 2 hosts with scripts/cluster.sh (network namespaces, real TCP, a tbf cap of --bandwidth-mbit on each host's
link), then, with 2 ranks per host:
  1. build/bench/bench_link: a 4-byte ping (the link's latency, taken as the model's alpha), a pipeline-sized
     message and the gradient's all-reduce over the 4 ranks, each against comm.emulate's prediction
     (comm/comm_options.h) for that link: alpha as measured, the cap as bandwidth;
  2. the trainer on 3 layouts of --config (dp 4; tp 2 inside each host x dp 2 across; pp 2 across the hosts x dp 2
     inside), --steps steps each: the median step time of the steps after the first 5, against the planner's
     prediction for the same layout with the inter-node link set to that alpha and bandwidth
     (comm.emulate.ranks_per_node=2, inter_latency_us, inter_bandwidth_gbps).
Prints the measured and predicted figures, their ratio and the bars (all-reduce within 15%, step within 20%).
Needs root and `ip netns` (exit 2 otherwise); takes a few minutes; keep the machine otherwise idle.

  /usr/bin/python3 bench/bench_network_model.py [--bandwidth-mbit 200] [--steps 20] [--config configs/gpt.yaml]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from bench_cli import float_above, int_at_least

src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--bandwidth-mbit", type=float_above(0), default=200)
ap.add_argument("--steps", type=int_at_least(1), default=20)
ap.add_argument("--config", default=os.path.join(src, "configs", "gpt.yaml"))
ap.add_argument("--build", default=os.path.join(src, "build"))
args = ap.parse_args()

cluster = os.path.join(src, "scripts", "cluster.sh")
trainer = os.path.join(args.build, "trainer")
planner = os.path.join(args.build, "planner")
bench_link = os.path.join(args.build, "bench", "bench_link")
env = dict(os.environ, OMP_NUM_THREADS="1")
gbps = args.bandwidth_mbit * 1e6 / 8 / 1e9  # the cap in GB/s (1e9 bytes per second)
# The model's bandwidth is what the cap leaves for data: tbf counts whole Ethernet frames, 1514 bytes for a TCP
# segment of 1448 (MTU 1500 less the IP and TCP headers with timestamps).
payload_gbps = gbps * 1448 / 1514
work = tempfile.mkdtemp(prefix="bench_network_model_")
MB = 4  # micro-batch: global_batch 16 over dp 4 leaves one micro-batch per rank
COMMON = ["--set", f"train.micro_batch={MB}", "--set", "comm.wait=poll", "--set", "train.eval_every=0", "--set", "run.log_every=100",
          "--set", "comm.timeout_s=120"]
LAYOUTS = [  # name, --set overrides, the planner row's keys
    ("dp4", ["parallel.dp=4", "parallel.tp=1", "parallel.pp=1"], dict(dp=4, tp=1, pp=1)),
    ("tp2 x dp2", ["parallel.dp=2", "parallel.tp=2", "parallel.pp=1"], dict(dp=2, tp=2, pp=1)),
    ("pp2 x dp2", ["parallel.dp=2", "parallel.tp=1", "parallel.pp=2"], dict(dp=2, tp=1, pp=2)),
]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)


def sets(pairs):
    return [x for p in pairs for x in ("--set", p)]


if os.geteuid() != 0:
    sys.exit("bench_network_model: needs root (network namespaces)")
for f in (trainer, planner, bench_link):
    if not os.path.exists(f):
        sys.exit(f"bench_network_model: {f} is missing (build it first)")
run([cluster, "down"])
up = run([cluster, "up", "2", "--bandwidth", f"{args.bandwidth_mbit:g}"])
if up.returncode != 0:
    print(up.stdout + up.stderr)
    sys.exit(up.returncode)
try:
    # The model's shapes: the gradient (fp32 parameters) and a pipeline message (micro_batch x seq_len x d_model).
    probe = run([trainer, "--config", args.config, "--set", "train.steps=1", "--set", f"run.dir={work}/probe"]
                + COMMON, timeout=300)
    params = float(re.search(r"model: .*?: ([0-9.]+)M parameters", probe.stdout + probe.stderr).group(1)) * 1e6
    grad_bytes = int(params) * 4
    cfg_lines = open(args.config).read()
    T = int(re.search(r"seq_len:\s*(\d+)", cfg_lines).group(1))
    C = int(re.search(r"d_model:\s*(\d+)", cfg_lines).group(1))
    msg_bytes = MB * T * C * 4

    def link_bench(alpha_us):
        r = run([cluster, "run", "-n", "4", "--", bench_link, "--bytes", str(grad_bytes), "--msg-bytes", str(msg_bytes),
                 "--latency-us", f"{alpha_us:.1f}", "--bandwidth-gbps", f"{payload_gbps:.6f}", "--iters", "15"], timeout=600)
        rows = {}
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) == 6 and f[0] in ("ping", "message", "all_reduce"):
                rows[f[0]] = dict(bytes=int(f[1]), measured=float(f[3]), predicted=float(f[4]), ratio=float(f[5]))
        if len(rows) != 3:
            sys.exit("bench_network_model: bench_link failed:\n" + r.stdout + r.stderr)
        return rows

    alpha_us = link_bench(0.0)["ping"]["measured"] * 1e3
    link = link_bench(alpha_us)
    print(f"link: tbf cap {args.bandwidth_mbit:g} Mbit/s = {gbps:.4f} GB/s per host and direction ({payload_gbps:.4f} "
          f"GB/s of TCP payload, the model's bandwidth); latency "
          f"(half a 4-byte ping-pong) {alpha_us:.0f} us; 2 hosts x 2 ranks")
    print(f"{'operation':<24} {'bytes':>10} {'measured ms':>12} {'model ms':>10} {'ratio':>7}")
    for name in ("message", "all_reduce"):
        r = link[name]
        print(f"{name + (' (4 ranks)' if name == 'all_reduce' else ' (pipeline)'):<24} {r['bytes']:>10} "
              f"{r['measured']:>12.2f} {r['predicted']:>10.2f} {r['ratio']:>7.3f}")

    plan = run([planner, "--config", args.config, "--world", "4", "--json"] + COMMON
               + sets(["comm.emulate.ranks_per_node=2", f"comm.emulate.inter_latency_us={alpha_us:.1f}",
                       f"comm.emulate.inter_bandwidth_gbps={payload_gbps:.6f}"]), timeout=900)
    if plan.returncode != 0:
        sys.exit("bench_network_model: planner failed:\n" + plan.stderr[-3000:])
    predictions = json.loads(plan.stdout)
    print(f"\n{'layout':<12} {'measured step ms':>16} {'model step ms':>14} {'ratio':>7} {'comm ms':>8} "
          f"{'model':>7} {'compute ms':>10} {'model':>7}   (medians of steps 6-{args.steps}; model: build/planner; "
          f"comm: the data-parallel collectives)")
    for name, overrides, keys in LAYOUTS:
        run_dir = f"{work}/{name.replace(' ', '')}"
        r = run([cluster, "run", "-n", "4", "--", trainer, "--config", args.config, "--set",
                 f"train.steps={args.steps}", "--set", f"run.dir={run_dir}"] + COMMON + sets(overrides), timeout=900)
        try:
            rows = [json.loads(l) for l in open(f"{run_dir}/metrics.jsonl") if l.strip()]
        except OSError:
            print(r.stdout[-2000:] + r.stderr[-2000:])
            raise
        measured = statistics.median(x["step_ms"] for x in rows if x["step"] > 5)
        comm = statistics.median(x["comm_ms"] for x in rows if x["step"] > 5)
        compute = statistics.median(x["compute_ms"] for x in rows if x["step"] > 5)
        mine = [p for p in predictions if all(p[k] == v for k, v in keys.items()) and p["zero"] == 0 and p["cp"] == 1
                and p["schedule"] == "1f1b" and p["virtual_stages"] == 1 and p["micro_batch"] == MB]
        p = mine[0] if mine else dict(step_ms=float("nan"), dp_comm_ms=float("nan"), compute_ms=float("nan"))
        print(f"{name:<12} {measured:>16.1f} {p['step_ms']:>14.1f} {measured / p['step_ms']:>7.3f} {comm:>8.1f} "
              f"{p['dp_comm_ms']:>7.1f} {compute:>10.1f} {p['compute_ms']:>7.1f}")
finally:
    run([cluster, "down"])
print("\nbars: all-reduce within 15% (ratio 0.87-1.15), step within 20% (0.83-1.20)")
