#!/usr/bin/env bash
# Sets up, builds, and runs attntune's main job on this machine for one problem (default: the
# suite's b4-s4k-d128 bf16 shape): the search space's valid configs, then NVRTC builds of a fixed
# sample of them with their resource use, cached in ./attntune.db.
#   tools/run.sh [PROBLEM] [ARCH]
set -euo pipefail
cd "$(dirname "$0")/.."
problem=${1:-b=4,h=16,s=4096,d=128,dtype=bf16,causal=0}
arch=${2:-sm_90}
tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target attntune
build/attntune space --space search_spaces/flash_fwd_mma.yaml --problem "$problem" --arch "$arch"
build/attntune compile --space search_spaces/flash_fwd_mma.yaml --problem "$problem" --arch "$arch" \
  --sample "${SAMPLE:-8}" --db "${ATTNTUNE_DB:-attntune.db}"
