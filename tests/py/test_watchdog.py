#!/usr/bin/env python3
"""A stopped rank must not hang the job: run watchdog_probe on 4 ranks (the last one SIGSTOPs itself before an
all-reduce) with comm.timeout_s = 5 and check the job ends non-zero within timeout + a few seconds, with the
watchdog's line naming the rank, communicator, operation and sequence number; once with each transport and way
of waiting (shared memory on 4 ranks; the MPI transport's comm.wait poll on 4 ranks, block on 2).

usage: test_watchdog.py MPIEXEC NUMPROC_FLAG WATCHDOG_PROBE"""
import re
import subprocess
import sys
import time

mpiexec, npflag, probe = sys.argv[1:4]
timeout_s = 5.0
grace_s = 10.0


def run(wait, ranks):
    """One job of `ranks` ranks whose communicators wait by `wait` (shm: the shared-memory transport, which
    sleeps; poll: MPI's polled nonblocking calls; block: blocking MPI calls, which spin: 2 ranks, so the spinning
    peer does not starve the 2-core CI machine)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([mpiexec, npflag, str(ranks), probe, str(timeout_s), wait], capture_output=True,
                           text=True, timeout=timeout_s + 40)
    except subprocess.TimeoutExpired:
        print("FAIL: the job hung (no end within %.0f s)" % (timeout_s + 40))
        return False
    elapsed = time.monotonic() - t0
    out = p.stdout + p.stderr
    print(out)
    print("[%s waits] exit status %d after %.1f s" % (wait, p.returncode, elapsed))
    ok = True
    if p.returncode == 0:
        print("FAIL: exit status 0"); ok = False
    pat = r"\[rank [0-2]\] watchdog: all_reduce #2 on communicator 'world' not complete after waiting [0-9.]+ s"
    if not re.search(pat, out):
        print("FAIL: no watchdog line matching %r" % pat); ok = False
    if elapsed < timeout_s:
        print("FAIL: ended before the timeout (%.1f s)" % elapsed); ok = False
    if elapsed > timeout_s + grace_s:
        print("FAIL: took %.1f s, more than timeout_s + %.0f s" % (elapsed, grace_s)); ok = False
    if "completed" in out:
        print("FAIL: an all_reduce completed"); ok = False
    return ok


sys.exit(0 if all([run("shm", 4), run("poll", 4), run("block", 2)]) else 1)
