#!/usr/bin/env bash
# Builds attntune and its tests, then runs every test. GPU tests (label gpu) skip with a reason
# where there is no GPU; run them on a GPU machine with: ctest --test-dir build -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# torch (tools/setup_torch.sh, a ~5 GB download on a fresh machine) installs beside the build, which
# is compile-bound; only the torch tests need it, and they start after both are done.
torch_log=$(mktemp)
tools/setup_torch.sh > "$torch_log" 2>&1 &
torch_pid=$!
trap 'kill "$torch_pid" 2>/dev/null || true; rm -f "$torch_log"' EXIT
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)"
wait "$torch_pid" || true
cat "$torch_log"
ctest --test-dir build --output-on-failure -j "$(nproc)"
