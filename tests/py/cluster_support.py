"""What the tests on scripts/cluster.sh's hosts share: the check lines, and skipping (exit 77, which ctest reports
as skipped) where the cluster cannot be made."""
import os
import shutil
import subprocess
import sys

_failed = False


def check(cond, what):
    global _failed
    _failed |= not cond
    print(f"{'ok  ' if cond else 'FAIL'} {what}", flush=True)


def skip(why):
    print(f"skip: {why}")
    sys.exit(77)


def require_cluster(root_for="network namespaces"):
    """Skips unless this process is root, `ip netns` works and no cluster is up already."""
    if os.geteuid() != 0:
        skip(f"needs root for {root_for}")
    if shutil.which("ip") is None:
        skip("no 'ip' command here (iproute2)")
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        skip("no 'ip netns' here")
    if os.path.exists("/run/meshtrain-cluster"):
        skip("a cluster is already up (scripts/cluster.sh down removes it)")


def exit_status():
    return 1 if _failed else 0
