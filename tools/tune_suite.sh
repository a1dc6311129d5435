#!/usr/bin/env bash
# Tunes every shape of the suite (the PyTorch peers' shapes, listed below), one campaign per shape and dtype, into
# one database, and optionally exports each winner. Runs on the GPU machine; re-running resumes
# every campaign.
#
#   tools/tune_suite.sh DB [--budget-evals N] [--dtypes "bf16 fp16"] [--only NAME] [--min-s N]
#                          [--space FILE]... [--export DIR] [tune options...]
#
# --space      the template space(s) to search (repeatable; several: one campaign over all of them);
#              default search_spaces/flash_fwd_mma.yaml. On a Hopper GPU:
#              --space search_spaces/flash_fwd_wgmma.yaml (issue 7's suite: --min-s 2048).
# --min-s N    only the shapes with s >= N.
# --export DIR write DIR/<campaign>.cu, each campaign's winner (`attntune export`); check and time
#              them with tools/compare_sdpa.py --cu DIR/*.cu.
# Campaign names are "<shape>-<dtype>" (b4-s4k-d128-bf16, ...). One database for both dtypes lets
# each campaign warm-start from the others. ATTNTUNE_BIN picks the binary (default build/attntune).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: tools/tune_suite.sh DB [--budget-evals N] [--dtypes \"bf16 fp16\"] [--only NAME] [--min-s N] [--space FILE]... [--export DIR] [tune options...]"
db=${1:?$usage}
shift
bin=${ATTNTUNE_BIN:-build/attntune}
budget=120
dtypes="bf16 fp16"
only=""
min_s=0
export_dir=""
spaces=()
extra=()
while (($#)); do
  case $1 in
    --budget-evals) budget=${2:?$usage}; shift 2 ;;
    --dtypes) dtypes=${2:?$usage}; shift 2 ;;
    --only) only=${2:?$usage}; shift 2 ;;
    --min-s) min_s=${2:?$usage}; shift 2 ;;
    --space) spaces+=(--space "${2:?$usage}"); shift 2 ;;
    --export) export_dir=${2:?$usage}; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
[[ $min_s =~ ^[0-9]+$ ]] || { echo "tune_suite.sh: --min-s takes a whole number, not '$min_s'" >&2; exit 2; }
((${#spaces[@]})) || spaces=(--space search_spaces/flash_fwd_mma.yaml)
[[ -n $export_dir ]] && mkdir -p "$export_dir"

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
ran=0
for dtype in $dtypes; do
  for entry in "${suite[@]}"; do
    read -r name b h s d causal <<<"$entry"
    [[ -n $only && $name != "$only" ]] && continue
    ((s >= min_s)) || continue
    campaign=$name-$dtype
    echo "== $campaign" >&2
    "$bin" tune "${spaces[@]}" --db "$db" --campaign "$campaign" \
      --problem "b=$b,h=$h,s=$s,d=$d,dtype=$dtype,causal=$causal" --budget-evals "$budget" "${extra[@]}"
    [[ -n $export_dir ]] && "$bin" export --db "$db" --campaign "$campaign" -o "$export_dir/$campaign.cu"
    ran=$((ran + 1))
  done
done
((ran)) || { echo "tune_suite.sh: no suite shape matches (--only '$only', --min-s $min_s)" >&2; exit 2; }
"$bin" campaigns --db "$db"
