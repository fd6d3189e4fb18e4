"""scripts/flight.py and `scripts/plot.py flight` on synthetic flight recorder dumps (RUN_DIR/flight/rank_N.json),
one run directory per scenario: a rank that never joined a collective (no dump, or busy elsewhere), a desync, every
collective completed, a receive whose peer never sent (no dump, never issued, and rings that overflowed), rings
that overflowed before a desync or a missing rank (aligned by coll_seq, not seq), and bad inputs (exit 2, naming
the file). Checks the analyzer's first line, --json, its exit statuses, and that the figure is a non-empty PNG.
Standard library only; about a second.
Usage: test_flight.py SOURCE_DIR WORK_DIR"""
import copy
import json
import os
import shutil
import subprocess
import sys

src, work = sys.argv[1:3]
FLIGHT = [sys.executable, os.path.join(src, "scripts", "flight.py")]
PLOT = [sys.executable, os.path.join(src, "scripts", "plot.py"), "flight"]
T0, DUMPED = 1_000_000.0, 11_000_000.0  # microseconds on each rank's clock: the dump is 10 s after the first op
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


# ---------------------------------------------------------------------------------------------------------------
# Building dumps


def op(seq, coll_seq, state="completed", kind="all_reduce", count=1024, dtype="fp32", peer=-1, tag=-1, step=5,
       mb=1, site=None):
    t = T0 + 1000.0 * seq
    return {"seq": seq, "coll_seq": coll_seq, "op": kind, "count": count, "dtype": dtype,
            "reduce": "sum" if kind in ("all_reduce", "reduce_scatter") else None, "peer": peer, "tag": tag,
            "state": state, "issue_us": t, "start_us": None if state == "queued" else t + 1.0,
            "end_us": t + 50.0 if state == "completed" else None,
            "where": {"step": step, "micro_batch": mb, "stage": 0, "chunk": 0, "site": site or f"bucket {coll_seq}"}}


def colls(first, last, last_state="completed", seq_offset=0, **kw):
    """Collectives #first..#last (seq = coll_seq + seq_offset), completed but the last one's state."""
    return [op(k + seq_offset, k, last_state if k == last else "completed", **kw) for k in range(first, last + 1)]


def p2p(seq, kind, peer, tag, state="completed", **kw):
    return op(seq, None, state, kind, count=2048, peer=peer, tag=tag, site="activations", **kw)


def group(name, ranks, me, ops, dropped=0, collectives_issued=None):
    """`me`: this rank's world rank. Totals count the ops that left the ring (dropped) as the C++ side does."""
    coll = [o["coll_seq"] for o in ops if o["coll_seq"] is not None]
    return {"name": name, "ranks": ranks, "rank": ranks.index(me), "issued": dropped + len(ops),
            "collectives_issued": collectives_issued if collectives_issued is not None else max(coll, default=0),
            "dropped": dropped, "ops": ops}


def dump(rank, groups, world=4, reason="asked by rank 1 (its watchdog)"):
    return {"format": "meshtrain-flight-recorder", "version": 1, "rank": rank, "world": world,
            "host": f"node{rank // 2}", "pid": 1000 + rank, "reason": reason, "dumped_us": DUMPED, "capacity": 2000,
            "where": {"step": 5, "micro_batch": 1, "stage": 0, "chunk": 0, "site": "bucket 3"}, "groups": groups}


def write_run(name, dumps):
    run = os.path.join(work, name)
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(os.path.join(run, "flight"))
    for d in dumps:
        with open(os.path.join(run, "flight", f"rank_{d['rank']}.json"), "w") as f:
            json.dump(d, f, indent=1)
    return run


def mesh(dp_ops, tp_ops, absent=()):
    """4 ranks: dp [0, 2], [1, 3] and tp [0, 1], [2, 3]; dp_ops / tp_ops {world rank: ops}; absent: no file."""
    dp = {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}
    tp = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    return copy.deepcopy([dump(r, [group("dp", dp[r], r, dp_ops[r]), group("tp", tp[r], r, tp_ops[r])])
                          for r in range(4) if r not in absent])  # a scenario may edit its dumps: no shared ops


def first_line(run, *extra):
    r = subprocess.run(FLIGHT + [run, *extra], capture_output=True, text=True, timeout=30)
    return r.returncode, (r.stdout.splitlines() or [""])[0], r.stdout, r.stderr


def analysis(name, run, must, must_not=()):
    rc, line, out, err = first_line(run)
    ok = rc == 0 and all(m in line for m in must) and not any(m in line for m in must_not)
    check(ok, f"{name}: exit {rc}, first line: {line}" + ("" if ok else f"\n     wanted {must}; stderr: {err}"))
    return out


def json_analysis(name, run, kind, faulty, **fields):
    rc, _, out, err = first_line(run, "--json")
    try:
        rep = json.loads(out)
    except ValueError:
        return check(False, f"{name} --json: exit {rc}, not JSON: {out[:200]} {err}")
    got = {k: rep.get(k) for k in fields}
    check(rc == 0 and rep.get("kind") == kind and rep.get("faulty_ranks") == faulty and got == fields
          and len(rep.get("ranks", [])) == 4 and rep["summary"],
          f"{name} --json: kind {rep.get('kind')!r}, faulty_ranks {rep.get('faulty_ranks')}, {got}")
    return rep


def start_plot(name, run):
    out = os.path.join(work, f"{name}.png")
    if os.path.exists(out):
        os.remove(out)
    return name, out, subprocess.Popen(PLOT + [run, "-o", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)


def check_plot(name, out, proc):
    log = proc.communicate(timeout=60)[0]
    size = os.path.getsize(out) if os.path.exists(out) else 0
    png = size > 0 and open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    check(proc.returncode == 0 and size > 1000 and png,
          f"plot.py flight ({name}): exit {proc.returncode}, {size} bytes, PNG {png}" + ("" if png else f": {log}"))


os.makedirs(work, exist_ok=True)
TP30 = {r: colls(1, 30) for r in range(4)}

# a) rank 3 left no dump; rank 1 waits in dp [1, 3] #50; ranks 0-2 completed their tp collectives.
run_a = write_run("a_no_dump", mesh({0: colls(1, 50), 1: colls(1, 50, "started"), 2: colls(1, 50), 3: []}, TP30,
                                    absent=[3]))
# b) desync: rank 2's all_reduce #50 on dp [0, 2] has 1025 elements, rank 0's 1024.
dp_b = {0: colls(1, 50, "started"), 1: colls(1, 50), 2: colls(1, 49) + [op(50, 50, "started", count=1025)],
        3: colls(1, 50)}
run_b = write_run("b_desync", mesh(dp_b, TP30))
# d) every collective completed, every rank dumped.
run_d = write_run("d_all_completed", mesh({r: colls(1, 50) for r in range(4)}, TP30))
# e) pp [0, 2], [1, 3] beside dp [0, 1], [2, 3]: rank 1's 4th recv from rank 3 (tag 7) pending, rank 3 no dump
# (below, after the helpers).


def pp_ops(n_recv, last_recv_state, first_seq=1, step=5, mb0=0):
    """Alternating recv (tag 7) and send (tag 8) with group rank 1; the n_recv-th recv in last_recv_state."""
    ops = []
    for i in range(n_recv):
        ops.append(p2p(first_seq + 2 * i, "recv", 1, 7, last_recv_state if i == n_recv - 1 else "completed",
                       step=step, mb=mb0 + i))
        if i < n_recv - 1:
            ops.append(p2p(first_seq + 2 * i + 1, "send", 1, 8, step=step, mb=mb0 + i))
    return ops


def peer_ops(n_send, first_seq=1, step=5, mb0=0):
    """Rank 3's side of pp [1, 3]: send (tag 7) then recv (tag 8) with group rank 0, n_send of each."""
    ops = []
    for i in range(n_send):
        ops.append(p2p(first_seq + 2 * i, "send", 0, 7, step=step, mb=mb0 + i))
        ops.append(p2p(first_seq + 2 * i + 1, "recv", 0, 8, step=step, mb=mb0 + i))
    return ops


def pp_mesh(rank1_pp, rank3_pp=None, dropped=0):
    dp = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    pp = {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}
    other = {0: [p2p(1, "send", 1, 7)], 2: [p2p(1, "recv", 0, 7)]}
    dumps = []
    for r in range(4):
        ops = rank1_pp if r == 1 else rank3_pp if r == 3 else other[r]
        if ops is not None:
            drop = dropped if r in (1, 3) else 0
            dumps.append(dump(r, [group("dp", dp[r], r, colls(1, 20)), group("pp", pp[r], r, ops, drop)]))
    return dumps


run_e = write_run("e_p2p_no_dump", pp_mesh(pp_ops(4, "started", mb0=0)))
run_e2 = write_run("e2_p2p_never_sent", pp_mesh(pp_ops(4, "started"), peer_ops(3)))
# Rings that overflowed (dropped 300): the counts start at unknown offsets, so step and micro-batch decide.
run_e3 = write_run("e3_p2p_overflow_never_sent", pp_mesh(pp_ops(4, "queued", 301, 9), peer_ops(3, 301, 9), 300))
run_e4 = write_run("e4_p2p_overflow_matched", pp_mesh(pp_ops(4, "queued", 301, 9), peer_ops(4, 301, 9), 300))

# Start the figures now: matplotlib's import is most of the test's time, and runs beside the analyzer's checks.
plots = [start_plot("missing", run_a), start_plot("p2p", run_e)]

analysis("a) no dump", run_a, ["rank 3 never joined collective #50 of group dp [1, 3]", "all_reduce of 1024 fp32",
                                "issued by rank 1", "rank 3 left no dump"])
out = first_line(run_a)[2]
rows = out.split("\n\n", 1)[1].splitlines()[2:6] if "\n\n" in out else []
check(len(rows) == 4 and rows[3].split()[:2] == ["3", "-"] and "no dump" in rows[3]
      and "dp #50 all_reduce" in rows[1] and "started" in rows[1],
      "a) table: a row per rank, rank 3 'no dump', rank 1 pending in dp #50:\n     " + "\n     ".join(rows))
json_analysis("a)", run_a, "missing", [3], group="dp", group_ranks=[1, 3], coll_seq=50)

analysis("b) desync", run_b, ["desync in group dp [0, 2]: at collective #50 rank 0 called all_reduce of 1024 fp32 "
                              "(sum) and rank 2 all_reduce of 1025 fp32 (sum)"])
rep = json_analysis("b)", run_b, "desync", [0, 2], group="dp", group_ranks=[0, 2], coll_seq=50)
check(rep and rep["summary"].startswith("desync"), "b) --json summary is the first line")

# b2) four ranks on one dp group: the ranks that agree are grouped, the odd one is the faulty rank.
b2 = [dump(r, [group("dp", [0, 1, 2, 3], r, colls(1, 49) + [op(50, 50, "started", count=1025 if r == 3 else 1024)])])
      for r in range(4)]
run_b2 = write_run("b2_desync_majority", b2)
analysis("b2) desync of one rank in four", run_b2, ["desync in group dp [0, 1, 2, 3]: at collective #50 ranks 0, 1, 2 "
                                                    "called all_reduce of 1024 fp32 (sum) and rank 3 all_reduce of "
                                                    "1025"])
json_analysis("b2)", run_b2, "desync", [3], group="dp", coll_seq=50)

# c) rank 2 skipped dp [0, 2] #50 (collectives_issued 49) and waits in tp [2, 3] #31 at step 6.
tp_c = {**TP30, **{r: colls(1, 31, "started", step=6, site="layer 0") for r in (2, 3)}}
run_c = write_run("c_skip", mesh({0: colls(1, 50, "started"), 1: colls(1, 50), 2: colls(1, 49), 3: colls(1, 50)}, tp_c))
analysis("c) skipped collective", run_c, ["rank 2 never joined collective #50 of group dp [0, 2]", "issued by rank 0",
                                          "rank 2 waits in its all_reduce #31 of group tp [2, 3]", "step 6"])

# a2) two ranks missing from the same collective are named together.
a2 = [dump(0, [group("dp", [0, 1, 2, 3], 0, colls(1, 50, "started"))]),
      dump(1, [group("dp", [0, 1, 2, 3], 1, colls(1, 49))])]
analysis("a2) two ranks missing", write_run("a2_two_missing", a2),
         ["ranks 1, 2, 3 never joined collective #50 of group dp [0, 1, 2, 3]", "rank 2 left no dump",
          "rank 1 has nothing pending"])

analysis("d) all completed", run_d, ["all ranks completed every collective they issued: the hang is outside the "
                                     "collectives"])
json_analysis("d)", run_d, "all_completed", [], group=None, coll_seq=None)
d2 = mesh({r: colls(1, 50) for r in range(4)}, TP30, absent=[2])
analysis("d2) completed but rank 2 no dump", write_run("d2_no_dump", d2),
         ["rank 2 left no dump (stopped or killed); every dumped rank completed every collective it issued"])

analysis("e) p2p peer no dump", run_e, ["rank 1's recv from rank 3 (tag 7, 2048 fp32", "in group pp [1, 3] never "
                                        "matched: rank 3 left no dump"])
json_analysis("e)", run_e, "p2p", [3], group="pp", group_ranks=[1, 3], coll_seq=None)
analysis("e2) p2p never sent", run_e2, ["rank 1's recv from rank 3", "never matched: rank 3 never issued its send",
                                        "rank 3 has nothing pending"])
analysis("e3) p2p never sent, rings overflowed", run_e3, ["rank 1's recv from rank 3", "micro-batch 3",
                                                          "rank 3 never issued its send"])
analysis("e4) p2p sent, rings overflowed", run_e4, ["rank 1's recv from rank 3", "is not complete though rank 3 "
                                                    "issued its send"], ["never matched"])

# f) rings that overflowed: rank 0 holds dp #20..#50 (seq 120..150: p2p ops before them), rank 2 holds #35..#50
# (seq 35..50). Aligned by seq they would not overlap at all; by coll_seq the desync at #45 shows.
dp_f0 = colls(20, 50, "started", seq_offset=100)
dp_f2 = colls(35, 50, "started")
dp_f2[45 - 35]["count"] = 1025
f = mesh({0: dp_f0, 1: colls(1, 50), 2: dp_f2, 3: colls(1, 50)}, TP30)
f[0]["groups"][0].update(dropped=119, issued=150)
f[2]["groups"][0].update(dropped=34, issued=50)
analysis("f) overflowed rings, desync", write_run("f_overflow_desync", f),
         ["desync in group dp [0, 2]: at collective #45", "rank 2 all_reduce of 1025"])
f2 = mesh({0: dp_f0, 1: colls(1, 50), 2: colls(30, 49), 3: colls(1, 50)}, TP30)
f2[0]["groups"][0].update(dropped=119, issued=150)
f2[2]["groups"][0].update(dropped=29, issued=49)
analysis("f2) overflowed rings, missing", write_run("f2_overflow_missing", f2),
         ["rank 2 never joined collective #50 of group dp [0, 2]", "issued by rank 0"])

# g) bad inputs: exit 2 with a reason on stderr that names the file.
def bad(name, run, words):
    rc, _, out, err = first_line(run)
    check(rc == 2 and err.startswith("flight: ") and all(w in err for w in words) and not out,
          f"g) {name}: exit {rc}, {err.strip()}")


bad("missing run dir", os.path.join(work, "no_such_run"), ["no such run directory"])
os.makedirs(os.path.join(work, "g_no_flight"), exist_ok=True)
bad("run dir without flight/", os.path.join(work, "g_no_flight"), ["flight"])
empty = write_run("g_empty", [])
bad("no rank_*.json", empty, ["no rank_*.json"])
trunc = write_run("g_truncated", mesh({r: colls(1, 5) for r in range(4)}, TP30))
with open(os.path.join(trunc, "flight", "rank_1.json"), "r+") as f:
    f.truncate(100)
bad("truncated JSON", trunc, ["rank_1.json", "not valid JSON"])
wrong = mesh({r: colls(1, 5) for r in range(4)}, TP30)
wrong[2]["groups"][1]["ops"][3]["state"] = "running"
bad("unknown state", write_run("g_bad_state", wrong), ["rank_2.json", "groups[1].ops[3]", "running"])
swapped = write_run("g_bad_rank", mesh({r: colls(1, 5) for r in range(4)}, TP30))
with open(os.path.join(swapped, "flight", "rank_1.json"), "w") as f:  # rank 2's dump under rank 1's name
    json.dump(mesh({r: colls(1, 5) for r in range(4)}, TP30)[2], f)
bad("rank not its file's", swapped, ["rank_1.json", "the file name says 1"])
r = subprocess.run(PLOT + [os.path.join(work, "no_such_run"), "-o", os.path.join(work, "x.png")],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "no such run directory" in r.stderr and not os.path.exists(os.path.join(work, "x.png")),
      f"g) plot.py flight on a missing run dir: exit {r.returncode}, {r.stderr.strip()}")

for name, out, proc in plots:
    check_plot(name, out, proc)

print(f"{'FAIL' if failures else 'PASS'}: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
