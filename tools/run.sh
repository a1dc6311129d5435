#!/usr/bin/env bash
# Sets up, builds, and runs attntune's main job for one problem (default: the suite's b4-s4k-d128
# bf16 shape):
#   with a GPU:    tune a campaign (evo, BUDGET evaluations, resumable: run it again to go on)
#                  over every family that serves the problem on this GPU (`tune` without --space
#                  picks them: flash_fwd_mma, flash_fwd_wgmma on a Hopper GPU, flash_decode for
#                  decoding's few query rows and paged caches, each where its space serves the problem),
#                  print the best configs and export the winner as attntune_best.cu and as a
#                  PyTorch package, attntune_best_torch/ (docs/EXPORT.md "From PyTorch");
#   without one:   the search space, NVRTC builds of a sample of it (resources, spills), and the
#                  search replayed on a real recorded campaign (evo against random search).
#   tools/run.sh [PROBLEM]        env: BUDGET (default 200), ATTNTUNE_DB (default ./attntune.db), DEVICE (0)
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
  # Without --space, tune searches every family that serves the problem on this GPU, ranked together.
  $A tune --problem "$problem" --db "$db" --budget-evals "${BUDGET:-200}" --device "${DEVICE:-0}"
  $A best --db "$db" --problem "$problem" --top 5
  $A export --db "$db" --problem "$problem" -o attntune_best.cu --torch attntune_best_torch
  echo "wrote attntune_best.cu (its header says how to build it; docs/EXPORT.md: call it, compare it with tools/compare_sdpa.py)"
  echo "and attntune_best_torch/, a PyTorch package of it: PYTHONPATH=attntune_best_torch python3 -c 'import attntune'"
else
  echo "no GPU here: showing the space, compiling a sample, and replaying a recorded campaign" >&2
  if grep -qE '(^|,)page=[1-9]' <<<"$problem"; then space=search_spaces/flash_decode.yaml; fi
  $A space --space $space --problem "$problem" --arch sm_90
  $A compile --space $space --problem "$problem" --arch sm_90 --sample "${SAMPLE:-8}" --db "$db"
  rec=tests/data/campaigns/h100-exhaustive-d128.db
  $A replay --db $rec --campaign h100-exhaustive-d128 --strategy evo --seeds 30 --target-pct 2
  # sed, not head: it reads to the end, so report never meets a closed pipe (an error, exit 3)
  $A report --db $rec --campaign h100-exhaustive-d128 | sed -n 1,40p
fi
