#!/usr/bin/python3
# scripts/flight.py: reads the flight recorder's dumps of a hung or failed run (RUN_DIR/flight/rank_<N>.json) and
# says in one sentence which rank, communicator and collective to look at. Standard library only.
"""Why a meshtrain run hung, from its flight recorder dumps (RUN_DIR/flight/rank_<N>.json).

  flight.py RUN_DIR            the first line is the one sentence to read, then a table with a row per rank:
                               its host, why it dumped, its last completed operation and its pending ones
  flight.py RUN_DIR --json     the same analysis as one JSON object (summary, kind, faulty_ranks, group,
                               group_ranks, coll_seq, ranks, ...)

The sentence is the first of these that the dumps show (docs/flight_recorder.md explains each):
  desync         the members of a communicator called different collectives at the same collective number
  missing        ranks never joined a collective that other members of the communicator wait in
  p2p            a pending send or receive whose peer left no dump or never issued the matching operation
  stuck          every member issued the operation, and it did not complete (transport, or queued behind another)
  no_dump        some ranks left no dump; every dumped rank completed every collective it issued
  all_completed  every rank completed every collective it issued: the hang is outside the collectives

Exit status: 0 an analysis printed (whether or not it found a fault), 2 a missing RUN_DIR or RUN_DIR/flight, no
rank_*.json there, or a malformed dump (named on stderr).
"""
import argparse
import json
import math
import os
import re
import signal
import sys

FORMAT, VERSION = "meshtrain-flight-recorder", 1
P2P = ("send", "recv")
STATES = ("queued", "started", "completed")


class FlightError(Exception):
    """A missing or malformed input (exit status 2); scripts/plot.py catches it too."""


# ---------------------------------------------------------------------------------------------------------------
# Reading and checking the dumps


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def expect(ok, where, what):
    if not ok:
        raise FlightError(f"{where}: {what}")


def check_op(op, g, at):
    expect(isinstance(op, dict), at, "not a JSON object")
    expect(isinstance(op.get("op"), str) and op["op"], at, '"op" missing or not a string')
    expect(op.get("state") in STATES, at, f'"state" is {op.get("state")!r}, not one of {", ".join(STATES)}')
    expect(is_int(op.get("seq")) and op["seq"] >= 1, at, '"seq" missing or not a positive integer')
    expect(is_int(op.get("count")), at, '"count" missing or not an integer')
    expect(is_num(op.get("issue_us")), at, '"issue_us" missing or not a number')
    if op["op"] in P2P:
        # Sends and receives carry no collective number: ranks issue different ones, so they never align.
        expect(op.get("coll_seq") is None, at, f'a {op["op"]} with a "coll_seq"')
        expect(is_int(op.get("peer")) and 0 <= op["peer"] < len(g["ranks"]), at,
               f'"peer" {op.get("peer")!r} is not a group rank of a group of {len(g["ranks"])}')
    else:
        expect(is_int(op.get("coll_seq")) and op["coll_seq"] >= 1, at,
               f'a {op["op"]} without a positive integer "coll_seq"')
    expect(op.get("where") is None or isinstance(op["where"], dict), at, '"where" is not an object')


def check_group(g, d, at):
    expect(isinstance(g, dict), at, "not a JSON object")
    expect(isinstance(g.get("name"), str), at, '"name" missing or not a string')
    ranks = g.get("ranks")
    expect(isinstance(ranks, list) and ranks and all(is_int(r) and 0 <= r < d["world"] for r in ranks), at,
           f'"ranks" is not a list of world ranks below {d["world"]}')
    expect(len(set(ranks)) == len(ranks), at, f'"ranks" {ranks} names a rank twice')
    expect(is_int(g.get("rank")) and 0 <= g["rank"] < len(ranks) and ranks[g["rank"]] == d["rank"], at,
           f'"rank" {g.get("rank")!r} is not the group rank of world rank {d["rank"]} in {ranks}')
    for key in ("issued", "collectives_issued", "dropped"):
        expect(is_int(g.get(key)) and g[key] >= 0, at, f'"{key}" missing or not a non-negative integer')
    expect(isinstance(g.get("ops"), list), at, '"ops" missing or not a list')
    for i, op in enumerate(g["ops"]):
        check_op(op, g, f"{at}.ops[{i}]")


def check_dump(d, path):
    expect(isinstance(d, dict), path, "not a JSON object")
    expect(d.get("format") == FORMAT, path, f'"format" is {d.get("format")!r}, not {FORMAT!r}')
    expect(d.get("version") == VERSION, path, f'version {d.get("version")!r}: this script reads version {VERSION}')
    expect(is_int(d.get("world")) and d["world"] >= 1, path, '"world" missing or not a positive integer')
    expect(is_int(d.get("rank")) and 0 <= d["rank"] < d["world"], path,
           f'"rank" {d.get("rank")!r} is not a rank of a world of {d["world"]}')
    expect(is_num(d.get("dumped_us")), path, '"dumped_us" missing or not a number')
    expect(isinstance(d.get("groups"), list), path, '"groups" missing or not a list')
    seen = set()
    for i, g in enumerate(d["groups"]):
        check_group(g, d, f"{path}: groups[{i}]")
        key = (g["name"], tuple(g["ranks"]))
        expect(key not in seen, path, f"group {label(key)} listed twice")
        seen.add(key)


def read_dump(path, rank):
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:  # a truncated or binary file is a ValueError (JSON or UTF-8)
        raise FlightError(f"{path}: not valid JSON ({e})")
    check_dump(d, path)
    expect(d["rank"] == rank, path, f'"rank" is {d["rank"]}, the file name says {rank}')
    return d


class Run:
    """The dumps of one run: dumps {world rank: dump}, world, and every communicator instance seen,
    instances {(name, ranks tuple): {world rank: that rank's group record, or None (no dump or no record)}}."""

    def __init__(self, dumps, world):
        self.dumps, self.world = dumps, world
        self.instances = {}
        for d in dumps.values():
            for g in d["groups"]:
                self.instances.setdefault((g["name"], tuple(g["ranks"])), {})
        for key, members in self.instances.items():
            for r in key[1]:
                members[r] = self.group(r, key)

    def group(self, rank, key):
        d = self.dumps.get(rank)
        return next((g for g in d["groups"] if (g["name"], tuple(g["ranks"])) == key), None) if d else None


def load_run(run_dir):
    """The Run of RUN_DIR/flight; FlightError when the directory or the dumps are missing or malformed."""
    if not os.path.isdir(run_dir):
        raise FlightError(f"no such run directory: {run_dir}")
    fdir = os.path.join(run_dir, "flight")
    if not os.path.isdir(fdir):
        raise FlightError(f"no {fdir}: no rank dumped (the flight recorder writes there on a hang, a fatal error "
                          "or a signal)")
    names = sorted(n for n in os.listdir(fdir) if n.startswith("rank_") and n.endswith(".json"))
    if not names:
        raise FlightError(f"{fdir}: no rank_*.json")
    dumps = {}
    for name in names:
        path = os.path.join(fdir, name)
        m = re.fullmatch(r"rank_(0|[1-9][0-9]*)\.json", name)
        expect(m, path, "not named rank_<world rank>.json")
        dumps[int(m.group(1))] = read_dump(path, int(m.group(1)))
    worlds = sorted({d["world"] for d in dumps.values()})
    expect(len(worlds) == 1, fdir, f"the dumps disagree on the world size ({', '.join(map(str, worlds))})")
    return Run(dumps, worlds[0])


# ---------------------------------------------------------------------------------------------------------------
# Words


def label(key):
    return f"{key[0]} [{', '.join(map(str, key[1]))}]"


def who(ranks):
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def where_text(op, short=False):
    """'step 5, micro-batch 1, bucket 3' (stage and chunk only when non-zero, as most runs have one)."""
    w = op.get("where") or {}
    parts = []
    for key, name in (("step", "step"), ("micro_batch", "mb" if short else "micro-batch"), ("stage", "stage"),
                      ("chunk", "chunk")):
        if w.get(key) is not None and (key in ("step", "micro_batch") or w[key] != 0):
            parts.append(f"{name} {w[key]}")
    if w.get("site"):
        parts.append(str(w["site"]))
    return (" " if short else ", ").join(parts)


def describe(op, key):
    """'all_reduce of 1024 fp32 (sum)'; a broadcast names its root's world rank."""
    if op["op"] == "barrier":
        return "barrier"
    text = f'{op["op"]} of {op["count"]} {op.get("dtype", "?")}'
    if op.get("reduce"):
        text += f' ({op["reduce"]})'
    if op["op"] == "broadcast" and is_int(op.get("peer")) and 0 <= op["peer"] < len(key[1]):
        text += f' (root rank {key[1][op["peer"]]})'
    return text


def p2p_text(op, key, extra=""):
    """"recv from rank 3 (tag 7, 2048 fp32)", extra text inside the parentheses."""
    direction = "from" if op["op"] == "recv" else "to"
    return (f'{op["op"]} {direction} rank {key[1][op["peer"]]} (tag {op.get("tag")}, {op["count"]} '
            f'{op.get("dtype", "?")}{extra})')


def op_name(op, key):
    """An operation named for a sentence: 'all_reduce #12' or 'recv from rank 3 (tag 7)'."""
    if op["op"] in P2P:
        return f'{op["op"]} {"from" if op["op"] == "recv" else "to"} rank {key[1][op["peer"]]} (tag {op.get("tag")})'
    return f'{op["op"]} #{op["coll_seq"]}'


def at_where(op):
    w = where_text(op)
    return f", at {w}" if w else ""


# ---------------------------------------------------------------------------------------------------------------
# Each rank's own operations


def rank_ops(run, rank):
    """(key, op) for every operation in the rank's rings."""
    d = run.dumps.get(rank)
    return [((g["name"], tuple(g["ranks"])), op) for g in (d["groups"] if d else []) for op in g["ops"]]


def pending_ops(run, rank):
    """The rank's operations not completed, oldest first (one process, one clock)."""
    return sorted(((k, o) for k, o in rank_ops(run, rank) if o["state"] != "completed"),
                  key=lambda ko: ko[1]["issue_us"])


def last_completed(run, rank):
    done = [(k, o) for k, o in rank_ops(run, rank) if o["state"] == "completed"]
    end = lambda ko: ko[1]["end_us"] if is_num(ko[1].get("end_us")) else ko[1]["issue_us"]
    return max(done, key=end) if done else None


def age_ms(run, rank, op):
    """How long before the rank's dump the operation was issued (queued) or started (started)."""
    since = op.get("start_us") if op["state"] == "started" and is_num(op.get("start_us")) else op["issue_us"]
    return (run.dumps[rank]["dumped_us"] - since) / 1000.0


def doing_instead(run, rank, key=None):
    """What a rank that did not join was doing: its first pending operation, or its last completed one."""
    d = run.dumps.get(rank)
    if d is None:
        return f"rank {rank} left no dump: stopped or killed"
    facts = []
    if str(d.get("reason", "")).startswith("fatal error"):  # most likely the cause: say it first
        facts.append(f'dumped on a {d["reason"]}')
    if key is not None and run.group(rank, key) is None:
        facts.append(f"has no record of group {label(key)}")
    pending, done = pending_ops(run, rank), last_completed(run, rank)
    if pending:
        k, op = pending[0]
        more = f" ({len(pending) - 1} more pending after it)" if len(pending) > 1 else ""
        facts.append(f"waits in its {op_name(op, k)} of group {label(k)}, {op['state']} "
                     f"{age_ms(run, rank, op):.0f} ms before its dump{at_where(op)}{more}")
    elif done:
        k, op = done
        facts.append(f"has nothing pending; its last completed operation: {op_name(op, k)} of group {label(k)}"
                     f"{at_where(op)}")
    else:
        facts.append("recorded no operation")
    return f"rank {rank} " + (", ".join(facts[:-1]) + " and " if len(facts) > 1 else "") + facts[-1]


# ---------------------------------------------------------------------------------------------------------------
# Findings. Each finder returns candidates, earliest first; analyze() takes the first kind that has one.


def when(op):
    """Sort key of a candidate: the earliest step and micro-batch first; the issue time (one rank's clock only)
    breaks ties."""
    w = op.get("where") or {}
    num = lambda v: v if is_num(v) else math.inf
    return (num(w.get("step")), num(w.get("micro_batch")), op["issue_us"])


def collectives(g):
    return [o for o in (g["ops"] if g else []) if o.get("coll_seq") is not None]


def signature(op):
    root = op.get("peer") if op["op"] == "broadcast" else None  # a broadcast from another root is a desync too
    return (op["op"], op["count"], op.get("dtype"), op.get("reduce"), root)


def finding(kind, summary, faulty, key=None, coll_seq=None, **extra):
    return dict(summary=summary, kind=kind, faulty_ranks=sorted(faulty), group=key[0] if key else None,
                group_ranks=list(key[1]) if key else None, coll_seq=coll_seq, **extra)


def find_desyncs(run):
    """Per communicator instance, the lowest collective number at which the dumped members' rings recorded
    different calls. Aligned by coll_seq: every member issues the same collectives in the same order."""
    out = []
    for key, members in run.instances.items():
        by_seq = {}
        for r, g in members.items():
            for op in collectives(g):
                by_seq.setdefault(op["coll_seq"], {})[r] = op
        for k in sorted(by_seq):
            if len({signature(o) for o in by_seq[k].values()}) > 1:
                out.append((when(by_seq[k][min(by_seq[k])]), desync(key, k, by_seq[k])))
                break
    return [f for _, f in sorted(out, key=lambda wf: wf[0])]


def desync(key, k, ops):
    classes = {}  # signature -> ranks that called it, in rank order
    for r in sorted(ops):
        classes.setdefault(signature(ops[r]), []).append(r)
    groups = sorted(classes.values())
    calls = [f"{who(rs)} {'called ' if i == 0 else ''}{describe(ops[rs[0]], key)}" for i, rs in enumerate(groups)]
    text = f"desync in group {label(key)}: at collective #{k} " + ", ".join(calls[:-1]) + " and " + calls[-1]
    wheres = [where_text(ops[rs[0]]) for rs in groups]
    if len(set(wheres)) == 1:
        text += f" (issued at {wheres[0]})" if wheres[0] else ""
    else:
        text += " (" + "; ".join(f"{who(rs)} at {w or 'an unrecorded place'}" for rs, w in zip(groups, wheres)) + ")"
    # The faulty ranks: those outside a strict majority when there is one, else every rank involved.
    sizes = sorted(len(rs) for rs in groups)
    big = max(groups, key=len)
    faulty = [r for rs in groups if rs is not big for r in rs] if sizes[-1] > 1 and sizes[-1] > sizes[-2] \
        else [r for rs in groups for r in rs]
    return finding("desync", text, faulty, key, k)


def collectives_issued(run, r, key):
    """How many collectives the rank issued on the instance; None when it left no dump (unknown)."""
    if r not in run.dumps:
        return None
    g = run.group(r, key)
    return max([g["collectives_issued"]] + [o["coll_seq"] for o in collectives(g)]) if g else 0


def find_waits(run):
    """Per communicator instance, the lowest pending collective: 'missing' when some members never issued it
    (or left no dump), 'stuck' when every member issued it."""
    missing, stuck = [], []
    for key, members in run.instances.items():
        pending = {}
        for r, g in members.items():
            for op in collectives(g):
                if op["state"] != "completed":
                    pending.setdefault(op["coll_seq"], {})[r] = op
        for k in sorted(pending):
            absent = [r for r in key[1] if (collectives_issued(run, r, key) or 0) < k]
            if absent:
                missing.append((key, k, pending[k], absent))
                break
            if not stuck or stuck[-1][0] != key:
                stuck.append((key, k, pending[k], []))
    order = lambda c: when(c[2][min(c[2])])

    # The root of a chain of waits first: a collective whose absent ranks wait for nothing themselves (they left no
    # dump, or have nothing pending), the fewer absent ranks that do wait the better; within a cycle of waits (a
    # rank that skipped a collective and went on into the next, which the others never reach), the collective the
    # most ranks wait in.
    def root_first(c):
        sinks = [r not in run.dumps or not pending_ops(run, r) for r in c[3]]
        return (not any(sinks), sinks.count(False), -len(c[2]), order(c))
    return sorted(missing, key=root_first), sorted(stuck, key=order)


def missing_findings(run, candidates):
    out, named = [], set()
    for key, k, waiting, absent in candidates:
        absent = [r for r in absent if r not in named]  # a rank missing from several groups: named once, first
        if not absent:
            continue
        named.update(absent)
        op = waiting[min(waiting)]
        w = where_text(op)
        text = (f"{who(absent)} never joined collective #{k} of group {label(key)}: {describe(op, key)}, issued by "
                f"{who(waiting)}{' at ' + w if w else ''} ("
                + "; ".join(doing_instead(run, r, key) for r in absent) + ")")
        out.append(finding("missing", text, absent, key, k, missing_ranks=sorted(absent),
                           waiting_ranks=sorted(waiting)))
    return out


def step_mb(op):
    w = op.get("where") or {}
    return (w["step"], w.get("micro_batch") or 0) if is_int(w.get("step")) else None


def peer_issued(run, key, rank, op):
    """Whether the peer issued the send (recv) matching this recv (send). Sends and receives between two ranks
    match in order per (direction, tag): the n-th recv from B with tag t takes B's n-th send to us with tag t."""
    mine_g, peer = run.group(rank, key), key[1][op["peer"]]
    peer_g = run.group(peer, key)
    if peer_g is None:
        return False
    same = lambda o, kind, peer_rank: o["op"] == kind and o["peer"] == peer_rank and o.get("tag") == op.get("tag")
    other = "recv" if op["op"] == "send" else "send"
    theirs = [o for o in peer_g["ops"] if same(o, other, mine_g["rank"])]
    if mine_g["dropped"] == 0 and peer_g["dropped"] == 0:  # both rings hold the whole history: count
        n = sum(1 for o in mine_g["ops"] if same(o, op["op"], op["peer"]) and o["seq"] <= op["seq"])
        return len(theirs) >= n
    # A ring overflowed, so the counts start at unknown offsets; fall back on where the trainer issued them:
    # a pipeline's matching send and recv carry the same step and micro-batch. Unknown places count as matched.
    mark = step_mb(op)
    return mark is None or any(step_mb(o) is None or step_mb(o) >= mark for o in theirs)


def find_p2p(run):
    """Pending sends and receives: unmatched ones (the peer left no dump or never issued its side), and matched
    ones that did not complete (stuck)."""
    unmatched, stuck = [], []
    for key, members in run.instances.items():
        for r, g in members.items():
            for op in (g["ops"] if g else []):
                if op["op"] in P2P and op["state"] != "completed":
                    peer = key[1][op["peer"]]
                    if peer not in run.dumps:
                        unmatched.append((key, r, op, f"rank {peer} left no dump (stopped or killed)"))
                    elif not peer_issued(run, key, r, op):
                        side = "recv" if op["op"] == "send" else "send"
                        unmatched.append((key, r, op, f"rank {peer} never issued its {side} ("
                                          + doing_instead(run, peer, key) + ")"))
                    else:
                        stuck.append((key, r, op, None))
    order = lambda c: when(c[2])
    return sorted(unmatched, key=order), sorted(stuck, key=order)


def p2p_finding(run, key, r, op, why):
    w = where_text(op)
    peer = key[1][op["peer"]]
    text = (f"rank {r}'s {p2p_text(op, key, ', issued at ' + w if w else '')} in group {label(key)} never matched: "
            + why)
    return finding("p2p", text, [peer], key, None, rank=r, peer=peer, seq=op["seq"], missing_ranks=[peer])


def stuck_collective(run, key, k, waiting):
    op = waiting[min(waiting)]
    behind = []
    for r in sorted(waiting):  # queued behind an earlier pending operation of the same communicator
        earlier = [o for o in run.group(r, key)["ops"] if o["state"] != "completed" and o["seq"] < waiting[r]["seq"]]
        if earlier:
            behind.append(f"on rank {r} it is queued behind its {op_name(earlier[0], key)}")
    why = "; ".join(behind) if behind else \
        "the communication itself did not finish (network, transport or a peer's communication thread)"
    text = (f"collective #{k} of group {label(key)} ({describe(op, key)}{at_where(op)}) was issued by every member "
            f"and is not complete on {who(waiting)}: {why}")
    return finding("stuck", text, list(waiting), key, k, waiting_ranks=sorted(waiting))


def stuck_p2p(run, key, r, op):
    peer = key[1][op["peer"]]
    text = (f"rank {r}'s {p2p_text(op, key, at_where(op))} in group {label(key)} is not complete though rank {peer} "
            f"issued its {'recv' if op['op'] == 'send' else 'send'}: the transfer itself is stuck")
    return finding("stuck", text, [r, peer], key, None, rank=r, peer=peer, seq=op["seq"])


def analyze(run):
    """Every finding, the one to print first at [0]."""
    found = find_desyncs(run)
    missing, stuck = find_waits(run)
    found += missing_findings(run, missing)
    unmatched, stuck_pp = find_p2p(run)
    found += [p2p_finding(run, *c) for c in unmatched]
    found += [stuck_collective(run, key, k, waiting) for key, k, waiting, _ in stuck]
    found += [stuck_p2p(run, key, r, op) for key, r, op, _ in stuck_pp]
    absent = [r for r in range(run.world) if r not in run.dumps]
    if absent and not found:  # its sentence says every dumped rank completed its collectives: only when true
        found.append(finding("no_dump", f"{who(absent)} left no dump (stopped or killed); every dumped rank "
                             "completed every collective it issued", absent, missing_ranks=absent))
    if not found:
        found.append(finding("all_completed", "all ranks completed every collective they issued: the hang is "
                             "outside the collectives", []))
    return found


# ---------------------------------------------------------------------------------------------------------------
# The per-rank table


def op_row(run, rank, key, op):
    row = {"group": key[0], "group_ranks": list(key[1]), "seq": op["seq"], "coll_seq": op.get("coll_seq"),
           "op": op["op"], "count": op["count"], "dtype": op.get("dtype"), "reduce": op.get("reduce"),
           "state": op["state"], "where": op.get("where"), "age_ms": round(age_ms(run, rank, op), 3)}
    if op["op"] in P2P:
        row.update(peer=key[1][op["peer"]], tag=op.get("tag"))
    return row


def rank_rows(run):
    rows = []
    for r in range(run.world):
        d = run.dumps.get(r)
        if d is None:
            rows.append({"rank": r, "dumped": False})
            continue
        done, pending = last_completed(run, r), pending_ops(run, r)
        rows.append({"rank": r, "dumped": True, "host": d.get("host"), "pid": d.get("pid"), "reason": d.get("reason"),
                     "last_completed": op_row(run, r, *done) if done else None, "pending": len(pending),
                     "first_pending": op_row(run, r, *pending[0]) if pending else None})
    return rows


def short_reason(reason):
    """'watchdog: all_reduce #57 ...' -> 'watchdog'; 'asked by rank 1 (its watchdog)' -> 'asked by rank 1'."""
    return re.sub(r"\s*\(.*\)$", "", str(reason or "-").split(": ", 1)[0])[:32]


def op_cell(op, with_state=False):
    num = f'#{op["coll_seq"]}' if op.get("coll_seq") is not None else f'seq {op["seq"]}'
    text = f'{op["group"]} {num} {op["op"]}'
    if op["op"] in P2P:
        text += f' {"from" if op["op"] == "recv" else "to"} {op["peer"]} tag {op["tag"]}'
    if op["op"] != "barrier":
        text += f' {op["count"]} {op["dtype"]}'
    if with_state:
        return f'{text} {op["state"]} {op["age_ms"]:.0f} ms'
    w = where_text(op, short=True)
    return f"{text} @ {w}" if w else text


def table(rows):
    head = ("rank", "host", "reason", "last completed", "pending (first)")
    cells = []
    for row in rows:
        if not row["dumped"]:
            cells.append((str(row["rank"]), "-", "no dump", "-", "-"))
            continue
        pending = f'{row["pending"]}: {op_cell(row["first_pending"], True)}' if row["pending"] else "0"
        cells.append((str(row["rank"]), str(row["host"] or "-"), short_reason(row["reason"]),
                      op_cell(row["last_completed"]) if row["last_completed"] else "-", pending))
    widths = [max(len(c[i]) for c in cells + [head]) for i in range(len(head))]
    fmt = lambda c: "  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip()
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def report(run):
    """The analysis as the JSON object --json prints; its "summary" is the first line of the text form."""
    found = analyze(run)
    out = dict(found[0])
    out["ranks"] = rank_rows(run)
    out["other_findings"] = [f["summary"] for f in found[1:]]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="flight.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (its flight/ holds the dumps)")
    ap.add_argument("--json", action="store_true", help="print the analysis as JSON")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `flight.py RUN_DIR | head -1` ends quietly
    try:
        out = report(load_run(args.run_dir))
    except FlightError as e:
        print(f"flight: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(out["summary"])
    print()
    print(table(out["ranks"]))
    if out["other_findings"]:
        print("\nAlso:")
        for text in out["other_findings"]:
            print(f"  - {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
