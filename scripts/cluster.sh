#!/usr/bin/env bash
# A local cluster of N hosts on this machine: network namespaces with their own hostnames on a Linux bridge, real
# TCP between them, and an optional bandwidth cap per host link; MPICH starts ranks spread over them. Needs root
# and `ip netns`. See docs/multinode.md.
#
#   scripts/cluster.sh up N [--bandwidth MBIT]   N hosts mt-h1..mt-hN (10.99.0.1..N; the bridge is 10.99.0.254)
#   scripts/cluster.sh run [-n RANKS] [--per-host K] [--env NAME=VALUE]... -- COMMAND...
#                                                RANKS (default N x K) ranks, K (default RANKS / N) per host, in
#                                                host order; exits with COMMAND's status; kills what it leaves behind
#   scripts/cluster.sh shape MBIT                cap (0: uncap) every host link, both directions
#   scripts/cluster.sh link HOST down|up         take a host's link down or bring it back (fault tests)
#   scripts/cluster.sh kill HOST                 SIGKILL every process in a host (fault tests)
#   scripts/cluster.sh bytes                     "HOST RX_BYTES TX_BYTES" of each host link, as the host sees it
#   scripts/cluster.sh status | down             what is up; remove everything `up` made (also after a failed up)
#   scripts/cluster.sh --help                    this text
#
# The hosts split this machine's cores: host K of N runs its processes on the K-th N-th of the cores this script
# may use (with fewer cores than hosts, they share them in turn), so that hosts do not oversubscribe the machine
# without saying so; a rank's default thread count follows (train.threads).
#
# Everything it makes is named mt-* and recorded in /run/meshtrain-cluster; it touches nothing else. Ranks talk
# TCP across hosts (UCX_TLS=tcp,self on the host's eth0) and shared memory within a host, as on real nodes.
set -euo pipefail

STATE=/run/meshtrain-cluster
PREFIX=mt-h
BRIDGE=mt-br0
NET=10.99.0
BRIDGE_IP=$NET.254
SELF=$(readlink -f "$0")

die() { echo "cluster.sh: $*" >&2; exit 2; }
# The header above; on stdout with status 0 when asked for (--help), else on stderr with status 2.
usage() {
  if [[ ${1:-2} == 0 ]]; then sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0; fi
  sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

require_root() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, veth links and a bridge); run it with sudo"
  command -v ip > /dev/null && ip netns list > /dev/null 2>&1 || die "needs 'ip netns' (iproute2) and a kernel with network namespaces"
}

hosts() { [[ -f $STATE/hosts ]] && cat "$STATE/hosts" || true; }
host_ip() { echo "$NET.${1#"$PREFIX"}"; }
require_up() { [[ -s $STATE/hosts ]] || die "no cluster is up (scripts/cluster.sh up N)"; }

# Cap a host's link at MBIT in both directions: the host's eth0 egress and the bridge port's egress toward it.
shape_host() {
  local h=$1 mbit=$2
  ip netns exec "$h" tc qdisc del dev eth0 root 2> /dev/null || true
  tc qdisc del dev "$h" root 2> /dev/null || true
  [[ $mbit == 0 ]] && return
  # Burst 16 KiB: a real link has no token bucket, and tbf's lets a burst through at the veth's speed (a 128 KiB
  # message took 0.47x its time at the rate with a 250 KB bucket). tbf times packets with high-resolution timers,
  # so the old rule burst >= rate / HZ no longer applies; 4 KiB cost throughput (docs/multinode.md).
  local burst=16384
  ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "${mbit}mbit" burst "$burst" latency 100ms
  tc qdisc add dev "$h" root tbf rate "${mbit}mbit" burst "$burst" latency 100ms
}

cmd_down() {
  require_root
  local h
  for h in $(hosts); do
    ip netns pids "$h" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
    ip link del "$h" 2> /dev/null || true
    ip netns del "$h" 2> /dev/null || true
  done
  [[ -f $STATE/bridge ]] && ip link del "$BRIDGE" 2> /dev/null || true
  rm -rf "$STATE"
}

cmd_up() {
  require_root
  local n=${1:-} mbit=0
  [[ $n =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 200 )) || die "up: give the number of hosts, 1..200 (got '${n}')"
  shift
  while (( $# )); do
    case $1 in
      --bandwidth) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--bandwidth takes Mbit/s as an integer"; mbit=$2; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ -e $STATE ]] && die "a cluster is already up ($(hosts | wc -l) hosts); scripts/cluster.sh down first"
  ip link show "$BRIDGE" > /dev/null 2>&1 && die "a link named $BRIDGE exists but was not made by this script"
  ip -4 addr show | grep -q "inet $NET\." && die "the subnet $NET.0/24 is already in use on this machine"
  mkdir -p "$STATE"
  trap 'echo "cluster.sh: up failed; removing what it made" >&2; cmd_down' ERR
  ip link add "$BRIDGE" type bridge
  touch "$STATE/bridge"
  ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i h
  for (( i = 1; i <= n; i++ )); do
    h=$PREFIX$i
    echo "$h" >> "$STATE/hosts"
    ip netns add "$h"
    ip link add "$h" type veth peer name eth0 netns "$h"
    ip link set "$h" master "$BRIDGE" up
    ip netns exec "$h" ip addr add "$(host_ip "$h")/24" dev eth0
    ip netns exec "$h" ip link set eth0 up
    ip netns exec "$h" ip link set lo up
    shape_host "$h" "$mbit"
  done
  echo "$mbit" > "$STATE/bandwidth"
  trap - ERR
  echo "cluster: $n hosts ($(hosts | tr '\n' ' ')) on $BRIDGE, $NET.1..$n, link cap $([[ $mbit == 0 ]] && echo none || echo "$mbit Mbit/s")"
}

# The cores host $1 (mt-hK) runs on, as a taskset list: its share of the cores this process may use.
host_cores() {
  local k=${1#"$PREFIX"} n cpus=() part lo hi c
  n=$(hosts | wc -l)
  for part in $(grep Cpus_allowed_list /proc/self/status | cut -f2 | tr ',' ' '); do
    lo=${part%-*}; hi=${part#*-}
    for (( c = lo; c <= hi; c++ )); do cpus+=("$c"); done
  done
  c=${#cpus[@]}
  if (( c < n )); then echo "${cpus[$(( (k - 1) % c ))]}"; return; fi
  local first=$(( (k - 1) * c / n )) last=$(( k * c / n - 1 )) list=""
  for (( i = first; i <= last; i++ )); do list+="${list:+,}${cpus[$i]}"; done
  echo "$list"
}

# hydra's ssh launcher calls `LAUNCHER -x HOST "cmd" args...` (this script, as ssh) and expects the words joined
# into a shell command.
cmd_exec() {
  while [[ ${1:-} == -* ]]; do shift; done
  [[ $# -ge 1 ]] || usage
  local ip=$1 h
  shift
  for h in $(hosts); do
    if [[ $(host_ip "$h") == "$ip" ]]; then
      exec ip netns exec "$h" unshare --uts taskset -c "$(host_cores "$h")" sh -c "hostname $h && exec $*"
    fi
  done
  echo "cluster.sh: no host with address $ip" >&2
  exit 255
}

cmd_run() {
  require_root
  require_up
  local ranks=0 per=0 envs=()
  while (( $# )); do
    case $1 in
      -n) ranks=$2; shift 2 ;;
      --per-host) per=$2; shift 2 ;;
      --env) envs+=(-genv "${2%%=*}" "${2#*=}"); shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (the command goes after --)" ;;
    esac
  done
  (( $# )) || die "run: no command (scripts/cluster.sh run -n 4 -- build/trainer --config ...)"
  local all=($(hosts)) n
  n=${#all[@]}
  if (( per == 0 )); then per=$(( ranks > 0 ? (ranks + n - 1) / n : 1 )); fi
  (( ranks == 0 )) && ranks=$(( n * per ))
  (( ranks <= n * per )) || die "run: $ranks ranks do not fit $n hosts x $per per host"
  local list="" h
  for h in "${all[@]}"; do list+="${list:+,}$(host_ip "$h"):$per"; done
  local status=0
  mpiexec -launcher ssh -launcher-exec "$SELF" -localhost "$BRIDGE_IP" -hosts "$list" -n "$ranks" \
    -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0 "${envs[@]}" "$@" || status=$?
  for h in "${all[@]}"; do ip netns pids "$h" | xargs -r kill -9 2> /dev/null || true; done
  return "$status"
}

cmd_bytes() {
  require_up
  local h
  for h in $(hosts); do
    echo "$h $(ip netns exec "$h" cat /sys/class/net/eth0/statistics/rx_bytes) $(ip netns exec "$h" cat /sys/class/net/eth0/statistics/tx_bytes)"
  done
}

host_arg() {
  require_up
  hosts | grep -qx "${1:-}" || die "no host '${1:-}' (hosts: $(hosts | tr '\n' ' '))"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  run) shift; cmd_run "$@" ;;
  -h | --help | help) usage 0 ;;
  -*) cmd_exec "$@" ;;  # hydra's launcher call: -x HOST COMMAND...
  shape) require_root; require_up; [[ ${2:-} =~ ^[0-9]+$ ]] || die "shape takes Mbit/s (0 = no cap)"
         for h in $(hosts); do shape_host "$h" "$2"; done; echo "$2" > "$STATE/bandwidth" ;;
  link) require_root; host_arg "${2:-}"; [[ ${3:-} == up || ${3:-} == down ]] || die "link HOST down|up"
        ip netns exec "$2" ip link set eth0 "$3" ;;
  kill) require_root; host_arg "${2:-}"; ip netns pids "$2" | xargs -r kill -9 ;;
  bytes) cmd_bytes ;;
  status) if [[ -s $STATE/hosts ]]; then echo "hosts: $(hosts | tr '\n' ' ')cap $(cat "$STATE/bandwidth") Mbit/s"; cmd_bytes
          else echo "no cluster is up"; fi ;;
  *) usage ;;
esac
