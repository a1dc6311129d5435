#!/usr/bin/env bash
# Sets up, builds, and runs attntune's main job for one problem (default: the suite's b4-s4k-d128
# bf16 shape):
#   with a GPU:    tune a campaign (evo, BUDGET evaluations, resumable: run it again to go on),
#                  print the best configs and export the winner as attntune_best.cu;
#   without one:   the search space, NVRTC builds of a sample of it (resources, spills), and the
#                  search replayed on a real recorded campaign (evo against random search).
#   tools/run.sh [PROBLEM]        env: BUDGET (default 200), ATTNTUNE_DB (default ./attntune.db)
set -euo pipefail
cd "$(dirname "$0")/.."
problem=${1:-b=4,h=16,s=4096,d=128,dtype=bf16,causal=0}
db=${ATTNTUNE_DB:-attntune.db}
space=search_spaces/flash_fwd_mma.yaml
tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target attntune
A=build/attntune
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  $A tune --space $space --problem "$problem" --db "$db" --budget-evals "${BUDGET:-200}"
  $A best --db "$db" --problem "$problem" --top 5
  $A export --db "$db" --problem "$problem" -o attntune_best.cu
  echo "wrote attntune_best.cu (docs/EXPORT.md: build it, call it, compare it with tools/compare_sdpa.py)"
else
  echo "no GPU here: showing the space, compiling a sample, and replaying a recorded campaign" >&2
  $A space --space $space --problem "$problem" --arch sm_90
  $A compile --space $space --problem "$problem" --arch sm_90 --sample "${SAMPLE:-8}" --db "$db"
  rec=tests/data/campaigns/h100-exhaustive-d128.db
  $A replay --db $rec --campaign h100-exhaustive-d128 --strategy evo --seeds 30 --target-pct 2
  $A report --db $rec --campaign h100-exhaustive-d128 | head -40
fi
