#!/usr/bin/env bash
# Gathers, on a Debian 12 machine with network access, what a CUDA build of meshtrain needs on a GPU machine
# that has its own CUDA toolkit, PyTorch and Python cuDNN/NCCL packages but no package registry, into the
# git-ignored folder .gpu-deps/ (scripts/gpu_check.sh, run on the GPU machine, uses it; docs/cuda.md):
#   .gpu-deps/debian-deps.tar.xz  Debian 12 packages (apt-get download, never installed here): MPICH and the
#                               libraries it loads, Eigen, yaml-cpp, spdlog, fmt, Catch2, OpenBLAS; unpacked
#                               (dpkg-deb -x) and trimmed of what a build never reads (static archives, LAPACK,
#                               documentation), one prefix tree rooted at usr/ (a third of the .debs' size)
#   .gpu-deps/debs/             with --keep-debs: the .deb files themselves instead of the tarball
#   .gpu-deps/llm.c/            a source snapshot of karpathy/llm.c, the baseline of scripts/bench_gpt2.sh
#   .gpu-deps/cudnn-frontend/   the header-only cuDNN frontend (include/ only), for llm.c's cuDNN attention
#   .gpu-deps/MANIFEST          what was fetched, with versions and sizes
# Usage: scripts/gpu_deps.sh [--keep-debs] [--llmc-git-dir DIR] [--cudnn-frontend-git-dir DIR]
#                            [--cudnn-frontend-ref REF]
#   Without a --*-git-dir, the two repositories are cloned from GitHub (shallow). The folder is rebuilt from
#   scratch each time. Third-party code stays in the ignored folder: it is never committed.
set -euo pipefail
cd "$(dirname "$0")/.."

KEEP_DEBS=0
LLMC_GIT_DIR=""
FRONTEND_GIT_DIR=""
FRONTEND_REF="${MT_CUDNN_FRONTEND_REF:-v1.12.0}"   # contemporary with the llm.c snapshot (2025); any v1.x builds
while (($#)); do
  case "$1" in
    --keep-debs) KEEP_DEBS=1; shift ;;
    --llmc-git-dir) LLMC_GIT_DIR="$2"; shift 2 ;;
    --cudnn-frontend-git-dir) FRONTEND_GIT_DIR="$2"; shift 2 ;;
    --cudnn-frontend-ref) FRONTEND_REF="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_deps: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

DEST=.gpu-deps
# Build: headers and CMake packages. Run: the shared libraries they and MPICH's launcher load, down to what
# any glibc-based image has (libc, libm, libstdc++, libgcc_s; libgomp comes with the compiler). libudev1,
# libnuma1, libgfortran5 and libquadmath0 are on many images already: scripts/gpu_check.sh uses the machine's
# own copy of any library the machine has, and these copies only for the rest.
PACKAGES=(
  mpich libmpich12 libmpich-dev             # MPI (mpiexec.hydra + hydra_pmi_proxy are in mpich)
  libhwloc15 libucx0 libnuma1 libslurm38     # what libmpich.so.12 and hydra load
  libudev1 libgfortran5 libquadmath0         # what libhwloc15, libmpich12 and OpenBLAS load
  libeigen3-dev
  libyaml-cpp-dev libyaml-cpp0.7
  libspdlog-dev libspdlog1.10
  libfmt-dev libfmt9
  catch2
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev   # CMakeLists.txt requires BLAS
)

command -v apt-get >/dev/null || { echo "gpu_deps: needs apt-get (a Debian 12 machine)" >&2; exit 1; }
. /etc/os-release
if [[ "${VERSION_CODENAME:-}" != bookworm ]]; then
  echo "gpu_deps: warning: this is ${PRETTY_NAME:-an unknown system}, not Debian 12 (bookworm)" >&2
fi

rm -rf "$DEST"
mkdir -p "$DEST"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
chmod 777 "$WORK"   # apt-get download writes as the _apt user where it can
mkdir -p "$WORK/debs" && chmod 777 "$WORK/debs"
echo "gpu_deps: downloading ${#PACKAGES[@]} Debian packages"
if ! (cd "$WORK/debs" && apt-get download -q "${PACKAGES[@]}" >/dev/null); then
  echo "gpu_deps: apt-get download failed; run 'apt-get update' (as root) and try again" >&2
  exit 1
fi
{
  echo "## Debian packages ($(du -sh "$WORK/debs" | cut -f1) as .deb files)"
  for f in "$WORK"/debs/*.deb; do
    printf '%s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(du -k "$f" | cut -f1)KiB"
  done
} >"$WORK/MANIFEST.debs"
if ((KEEP_DEBS)); then
  mv "$WORK/debs" "$DEST/debs"
else
  echo "gpu_deps: unpacking and trimming them into $DEST/debian-deps.tar.xz"
  mkdir -p "$WORK/prefix"
  for f in "$WORK"/debs/*.deb; do dpkg-deb -x "$f" "$WORK/prefix"; done
  # What no build or run reads: static archives no CMake package names (Catch2's main stays), LAPACK (the
  # project uses BLAS only), docs, man pages.
  local_cmake=$(find "$WORK/prefix" -name '*.cmake' -print0 | xargs -0 cat)
  while IFS= read -r a; do
    grep -qF "$(basename "$a")" <<<"$local_cmake" || rm -f "$a"
  done < <(find "$WORK/prefix" -name '*.a')
  find "$WORK/prefix" -name 'liblapack*' \( -type f -o -type l \) -delete
  rm -rf "$WORK/prefix/usr/share/doc" "$WORK/prefix/usr/share/man" "$WORK/prefix/usr/share/lintian"
  cp "$WORK/MANIFEST.debs" "$WORK/prefix/MANIFEST.debs"
  XZ_OPT="-6 -T0" tar -C "$WORK/prefix" -cJf "$DEST/debian-deps.tar.xz" .
fi

# Snapshot of a git repository's tree (no history) into a folder: from a local git dir, or a shallow clone.
snapshot() {  # snapshot NAME URL GIT_DIR REF DEST [PATHS...]
  local name="$1" url="$2" gitdir="$3" ref="$4" out="$5"
  shift 5
  local tmp=""
  if [[ -z "$gitdir" ]]; then
    tmp=$(mktemp -d)
    if [[ "$ref" == HEAD ]]; then
      git clone -q --depth 1 "$url" "$tmp/repo"
    else
      git clone -q --depth 1 --branch "$ref" "$url" "$tmp/repo"
    fi
    gitdir="$tmp/repo/.git"
  fi
  if ! git --git-dir="$gitdir" rev-parse -q --verify "$ref^{commit}" >/dev/null; then
    echo "gpu_deps: $name has no $ref; using HEAD" >&2
    ref=HEAD
  fi
  mkdir -p "$out"
  git --git-dir="$gitdir" archive "$ref" "$@" | tar -x -C "$out"
  echo "$name $(git --git-dir="$gitdir" rev-parse "$ref^{commit}") ($ref, $(git --git-dir="$gitdir" log -1 --format=%cs "$ref"))" \
    >>"$WORK/MANIFEST.repos"
  [[ -n "$tmp" ]] && rm -rf "$tmp"
  return 0
}

echo "gpu_deps: llm.c source snapshot into $DEST/llm.c"
snapshot llm.c https://github.com/karpathy/llm.c "$LLMC_GIT_DIR" HEAD "$DEST/llm.c"
# llm.c's dev/cuda kernels and docs are not needed to build train_gpt2cu.
rm -rf "$DEST/llm.c/dev/cuda" "$DEST/llm.c/doc" "$DEST/llm.c/dev/vislog.ipynb"
echo "gpu_deps: cuDNN frontend headers ($FRONTEND_REF) into $DEST/cudnn-frontend"
snapshot cudnn-frontend https://github.com/NVIDIA/cudnn-frontend "$FRONTEND_GIT_DIR" "$FRONTEND_REF" \
  "$DEST/cudnn-frontend" include LICENSE.txt

{
  echo "# .gpu-deps, made by scripts/gpu_deps.sh on $(date -u +%Y-%m-%dT%H:%MZ) (${PRETTY_NAME:-?})"
  cat "$WORK/MANIFEST.debs"
  echo "## Source snapshots"
  cat "$WORK/MANIFEST.repos"
  echo "## Sizes"
  du -sh "$DEST"/* | grep -v MANIFEST
  echo "total $(du -sh "$DEST" | cut -f1)"
} >"$DEST/MANIFEST"

cat "$DEST/MANIFEST"
total_kib=$(du -sk "$DEST" | cut -f1)
if ((total_kib > 32 * 1024)); then
  echo "gpu_deps: warning: $DEST is $((total_kib / 1024)) MiB; the copy sent to the GPU machine should stay small" >&2
fi
echo "gpu_deps: done; $DEST is $((total_kib / 1024)) MiB ($total_kib KiB)"
