#!/usr/bin/env bash
# Builds attntune and its tests, then runs every test. GPU tests (label gpu) skip with a reason
# where there is no GPU; run them on a GPU machine with: ctest --test-dir build -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/setup_torch.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)"
