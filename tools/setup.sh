#!/usr/bin/env bash
# Installs what attntune builds with, from Debian's packages. Idempotent; runs as root or via sudo.
# The CUDA toolkit (nvcc, NVRTC, cuda.h) is expected under /usr/local/cuda or $CUDA_HOME: it is
# not a Debian package here.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libyaml-cpp-dev libboost-program-options-dev libsqlite3-dev
          nlohmann-json3-dev libfmt-dev libxxhash-dev libgtest-dev libgmock-dev sqlite3
          librsvg2-bin   # rsvg-convert: `report --plot x.png`
          munge slurmctld slurmd slurm-client jq  # tests/service/slurm_test.sh: a real Slurm
          patch)  # tools/check_fa4_patches.py (the fa4_kit_patches test)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "attntune setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/nvrtc.h" ]; then
  echo "attntune setup: no CUDA toolkit at $cuda (need nvrtc.h and libnvrtc.so.13; set CUDA_HOME)" >&2
  exit 3
fi
echo "attntune setup: dependencies present (CUDA toolkit at $cuda)"

