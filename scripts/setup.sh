#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages easyctx builds and runs with. Idempotent: installs
# only what is missing. The CUDA toolkit, cuDNN and NCCL are not in Debian's archive: when
# present (nvcc on its usual path) the CUDA backend is built too; otherwise CPU only.
# dict-gcide, manpages, manpages-dev, bible-kjv, jargon-text and fortunes are the natural text
# of the context-extension proof (scripts/make_text_corpus.py, docs/results.md). Slurm and
# munge run the tests/slurm tests (a private cluster); Chromium renders the run
# report page there (headless).
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config ccache
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libyaml-cpp-dev libboost-program-options-dev
  libgtest-dev libgmock-dev
  libsentencepiece-dev sentencepiece libpcre2-dev libzstd-dev zstd
  bible-kjv bible-kjv-text jargon-text fortunes dict-gcide manpages manpages-dev jq python3 python3-sentencepiece
  slurm-wlm munge
  chromium fonts-dejavu-core
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
