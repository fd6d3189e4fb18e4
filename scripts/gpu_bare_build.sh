#!/usr/bin/env bash
# gpu_check.sh's configure and build steps in a bare system, without a GPU machine (docs/cuda.md): a minimal
# Debian 12 made by debootstrap with only a compiler, CMake, ninja, make, git and python3 (no MPICH, Eigen,
# yaml-cpp, spdlog, fmt, Catch2 or OpenBLAS), this machine's CUDA toolkit bound in, and a stand-in nvidia-smi
# that reports one sm_90 GPU so that gpu_check.sh builds. Its test step then runs a few CPU tests of that build
# (MPI on 2 ranks, the dp and tp parity runs) through the prefix's libraries. What it shows: building and running
# need nothing from the system beyond the toolchain and .gpu-deps/. Root, and network for debootstrap, are
# needed; nothing in / changes.
#
#   scripts/gpu_bare_build.sh [--root DIR] [--cuda DIR] [-- gpu_check.sh arguments]
#
# --root: where the system is made (default /tmp/mt-bare; reused if it is there). --cuda: the toolkit, with
# NCCL and cuDNN in it (default /usr/local/cuda's target). The arguments after -- replace the default ones
# below (a 2-core machine builds in 5 to 15 minutes, idle or busy).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD BARE=/tmp/mt-bare CUDA=$(readlink -f /usr/local/cuda)
CHECK_ARGS=(--steps deps,locate,configure,build,cuda-tests --tests '^(test_comm_np2|dp_parity|tp_parity)$'
  --build-cap 3600 --budget 4200)
while (($#)); do
  case "$1" in
    --root) BARE="$2"; shift 2 ;;
    --cuda) CUDA="$2"; shift 2 ;;
    --) shift; CHECK_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_bare_build: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "gpu_bare_build: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
[[ -d .gpu-deps ]] || { echo "gpu_bare_build: no .gpu-deps/: run scripts/gpu_deps.sh first" >&2; exit 2; }
if [[ ! -x "$BARE/usr/bin/g++" ]]; then
  debootstrap --variant=minbase --include=g++,cmake,ninja-build,python3,xz-utils,make,git,ca-certificates \
    bookworm "$BARE" http://deb.debian.org/debian
fi
mounts=()
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -R -l "${mounts[i]}" || true; done; }
trap cleanup EXIT
bind() { mkdir -p "$2"; mount --bind "$1" "$2"; mounts+=("$2"); }
bind "$CUDA" "$BARE$CUDA"
ln -sfn "$CUDA" "$BARE/usr/local/cuda"
mount -t proc proc "$BARE/proc"; mounts+=("$BARE/proc")
# /dev with what is mounted under it (MPICH's shared memory is /dev/shm), kept from sending unmounts back.
mount --rbind /dev "$BARE/dev"; mount --make-rslave "$BARE/dev"; mounts+=("$BARE/dev")
cat >"$BARE/usr/local/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# Stand-in: one sm_90 GPU, so that gpu_check.sh runs its build step. Nothing that needs a GPU can pass here.
case "$*" in
  -L) echo "GPU 0: stand-in (no GPU)" ;;
  *compute_cap*) echo "9.0" ;;
  *--query-gpu*) echo "stand-in (no GPU), 0, 0 MiB" ;;
  *) echo "CUDA Version: 13.0" ;;
esac
EOF
chmod +x "$BARE/usr/local/bin/nvidia-smi"
# The committed tree and .gpu-deps, at the path the build will have on a GPU machine's copy.
rm -rf "$BARE/work/main"
mkdir -p "$BARE/work"
git clone -q "$ROOT" "$BARE/work/main"
cp -a .gpu-deps "$BARE/work/main/"
rc=0
chroot "$BARE" /bin/bash -c "cd /work/main && scripts/gpu_check.sh --report-dir /work/gpu-report $(printf '%q ' "${CHECK_ARGS[@]}")" \
  || rc=$?
echo "gpu_bare_build: report in $BARE/work/gpu-report/report.md"
exit $rc
