"""run.profile=true writes run.dir/trace.json: valid Chrome-trace JSON with, for every rank (pid), compute
spans, each collective, and the waits on communication; metrics.jsonl's comm_ms is consistent with the trace
(each step's comm_ms is at most its step_ms). The trace also shows data parallelism's overlap: with
comm.overlap=true gradient buckets are issued while the backward pass runs; with false, only after it.
comm_cpu_ms (the communication threads' CPU time per step) is in every row and within its structural bound, and
each rank's communication threads appear as "running" slices on "comm <name> thread" rows.
scripts/trace_waits.py's summary of the waits adds up to the trace's.
Standard library only.
Usage: test_profile_trace.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import collections
import json
import os
import subprocess
import sys

mpiexec, trainer, src, work = sys.argv[1:5]
# Communication threads per rank in these runs: world, dp, tp and pp, one thread each (no network emulation, no
# hierarchical dp, pp = 1 so no embedding group). N threads cannot use more than N x step_ms of CPU in a step.
COMM_THREADS = 4


def check_comm_cpu(rows):
    for row in rows:
        assert "comm_cpu_ms" in row, row
        assert 0 <= row["comm_cpu_ms"] <= COMM_THREADS * row["step_ms"], row
    keys = list(rows[0])
    assert keys.index("comm_cpu_ms") == keys.index("comm_ms") + 1, keys


def check_thread_rows(run_dir, events):
    """Every rank has "running" slices (cat comm_thread) on its own "comm <name> thread" rows."""
    trace = json.load(open(os.path.join(run_dir, "trace.json")))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    running = [e for e in events if e["cat"] == "comm_thread"]
    assert running and all(e["name"] == "running" and e["dur"] >= 0 for e in running), running[:3]
    rows = {names.get((e["pid"], e["tid"]), "") for e in running}
    assert all(r.startswith("comm ") and r.endswith(" thread") for r in rows), rows
    # Thread rows are rows of their own, not the compute, wait or collective rows.
    other = {(e["pid"], e["tid"]) for e in events if e["cat"] != "comm_thread"}
    assert not other & {(e["pid"], e["tid"]) for e in running}, "a running slice shares a row with other events"
    for pid in (0, 1):
        n = sum(e["pid"] == pid for e in running)
        assert n > 0, f"rank {pid} has no running slice on a comm thread row"
    print(f"comm thread rows: {sorted(rows)}, {len(running)} running slices")


def traced_run(name, overlap, sets=("parallel.dp=2",)):
    run_dir = os.path.join(work, name)
    cmd = [mpiexec, "-n", "2", trainer, "--config", os.path.join(src, "configs", "tiny.yaml"), "--set",
           "run.profile=true", "--set", "train.steps=4", "--set", "comm.bucket_mb=0.01",
           "--set", f"comm.overlap={'true' if overlap else 'false'}", "--set", f"run.dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    trace = json.load(open(os.path.join(run_dir, "trace.json")))
    return run_dir, [e for e in trace["traceEvents"] if e["ph"] == "X"]


def buckets_issued_during_backward(events, pid):
    """dp all-reduces issued (ts - queued_us) strictly inside one of this rank's backward spans."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["pid"] == pid and e["name"] == "backward"]
    issued = [e["ts"] - e["args"]["queued_us"] for e in events if e["pid"] == pid and e["name"] == "dp all_reduce"]
    return sum(any(b < t < end for b, end in spans) for t in issued)


run_dir, events = traced_run("overlap_on", True)
kinds = collections.Counter((e["pid"], e["cat"]) for e in events)
print(dict(kinds))
for pid in (0, 1):
    for cat in ("compute", "comm", "wait"):
        assert kinds[(pid, cat)] > 0, f"rank {pid} has no {cat} events"
assert all(e["dur"] >= 0 for e in events)
names = {e["name"] for e in events}
assert {"forward", "backward", "optimizer", "dp all_reduce"} <= names, names
# Both ranks issue the same collectives in the same order: equal counts per communicator operation.
per_rank = [collections.Counter(e["name"] for e in events if e["pid"] == p and e["cat"] == "comm") for p in (0, 1)]
assert per_rank[0] == per_rank[1], per_rank
rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
for row in rows:
    assert 0 < row["comm_ms"] <= row["step_ms"] and 0 <= row["exposed_comm_ms"] <= row["step_ms"], row
check_comm_cpu(rows)
print(f"comm_cpu_ms per step: {[r['comm_cpu_ms'] for r in rows]} (comm_ms {[r['comm_ms'] for r in rows]})")
check_thread_rows(run_dir, events)
# scripts/trace_waits.py: each rank's waits per step by kind and pass add up to the trace's waits between its first
# and last optimizer spans, and sit inside a pass or between passes.
summary = json.loads(subprocess.run([sys.executable, os.path.join(src, "scripts", "trace_waits.py"),
                                     os.path.join(run_dir, "trace.json"), "--skip", "0", "--json"],
                                    check=True, capture_output=True, text=True, timeout=60).stdout)
assert sorted(summary) == ["0", "1"], summary
for pid in (0, 1):
    s = summary[str(pid)]
    opt = sorted(e["ts"] for e in events if e["pid"] == pid and e["name"] == "optimizer")
    waited = sum(e["dur"] for e in events if e["pid"] == pid and e["cat"] == "wait" and opt[0] <= e["ts"] < opt[-1])
    assert s["steps"] == len(opt) - 1, s
    assert abs(sum(w["ms"] for w in s["waits"]) * s["steps"] - waited / 1e3) < 1e-6, (s, waited)
    assert {w["pass"] for w in s["waits"]} <= {"forward", "backward", "between"}, s["waits"]
    assert any(w["name"] == "gradient buckets" for w in s["waits"]), s["waits"]
print(f"trace_waits.py: rank 0 waits {summary['0']['waits']}")
during = [buckets_issued_during_backward(events, p) for p in (0, 1)]
print(f"overlap on: buckets issued during the backward pass per rank: {during}")
assert all(n > 0 for n in during), "overlap on, but no bucket was issued during a backward pass"
_, events_off = traced_run("overlap_off", False)
during_off = [buckets_issued_during_backward(events_off, p) for p in (0, 1)]
print(f"overlap off: buckets issued during the backward pass per rank: {during_off}")
assert during_off == [0, 0], "overlap off, yet buckets were issued during a backward pass"
# Tensor parallelism's collectives are accounted too: they appear in the trace and in comm_ms / exposed_comm_ms.
tp_dir, tp_events = traced_run("tp2", True, ("parallel.tp=2", "parallel.dp=1", "model.n_head=4"))
tp_ops = collections.Counter(e["name"] for e in tp_events if e["cat"] == "comm")
print(f"tp=2 collectives in the trace: {dict(tp_ops)}")
assert tp_ops["tp all_reduce"] > 0, "no tensor-parallel all-reduce in the trace"
rows = [json.loads(line) for line in open(os.path.join(tp_dir, "metrics.jsonl"))]
assert all(r["comm_ms"] > 0 and r["exposed_comm_ms"] > 0 for r in rows), rows
check_comm_cpu(rows)
check_thread_rows(tp_dir, tp_events)
print("ok")
