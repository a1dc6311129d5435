#!/usr/bin/env bash
# Tunes flash_fwd_mma for every shape of the suite (../shared/peers/README.md), one campaign per
# shape and dtype, into one database. Runs on the GPU machine; re-running resumes every campaign.
#
#   tools/tune_suite.sh DB [--budget-evals N] [--dtypes "bf16 fp16"] [--only NAME] [tune options...]
#
# Campaign names are "<shape>-<dtype>" (b4-s4k-d128-bf16, ...). ATTNTUNE_BIN picks the binary
# (default build/attntune).
set -euo pipefail
cd "$(dirname "$0")/.."
db=${1:?usage: tools/tune_suite.sh DB [--budget-evals N] [--dtypes "bf16 fp16"] [--only NAME] [tune options...]}
shift
bin=${ATTNTUNE_BIN:-build/attntune}
budget=120
dtypes="bf16 fp16"
only=""
extra=()
while (($#)); do
  case $1 in
    --budget-evals) budget=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done

# name b h s d causal: the suite, largest work first so a time-limited run covers what matters most.
suite=(
  "b1-s16k-d128 1 16 16384 128 0"
  "b1-s16k-d128-causal 1 16 16384 128 1"
  "b4-s4k-d128 4 16 4096 128 0"
  "b4-s4k-d128-causal 4 16 4096 128 1"
  "b8-s2k-d64 8 16 2048 64 0"
  "b8-s2k-d64-causal 8 16 2048 64 1"
  "seed-s512 2 8 512 64 0"
  "seed-s128-causal 2 8 128 64 1"
)
for dtype in $dtypes; do
  for entry in "${suite[@]}"; do
    read -r name b h s d causal <<<"$entry"
    [[ -n $only && $name != "$only" ]] && continue
    echo "== $name $dtype" >&2
    "$bin" tune --space search_spaces/flash_fwd_mma.yaml --db "$db" --campaign "$name-$dtype" \
      --problem "b=$b,h=$h,s=$s,d=$d,dtype=$dtype,causal=$causal" --budget-evals "$budget" "${extra[@]}"
  done
done
"$bin" campaigns --db "$db"
