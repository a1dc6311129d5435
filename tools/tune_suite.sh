#!/usr/bin/env bash
# Tunes every shape of the suite (the PyTorch peers' shapes, listed below), one campaign per shape and dtype, into
# one database, and optionally exports each winner. Runs on the GPU machine; re-running resumes
# every campaign.
#
#   tools/tune_suite.sh DB [--suite prefill|decode] [--budget-evals N] [--dtypes "bf16 fp16"] [--only NAME]
#                          [--min-s N] [--page N] [--space FILE]... [--export DIR] [tune options...]
#
# --suite      prefill (default): the shapes below in each of --dtypes; decode: the decode suite
#              (each row in its own dtype; default space search_spaces/flash_decode.yaml).
# --page N     decode: tune the rows over a paged KV cache of pages of N rows (campaigns "-pN").
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
usage="usage: tools/tune_suite.sh DB [--suite prefill|decode] [--budget-evals N] [--dtypes \"bf16 fp16\"] [--only NAME] [--min-s N] [--page N] [--space FILE]... [--export DIR] [tune options...]"
db=${1:?$usage}
shift
bin=${ATTNTUNE_BIN:-build/attntune}
budget=120
dtypes="bf16 fp16"
only=""
min_s=0
export_dir=""
which=prefill
page=0
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
    --suite) which=${2:?$usage}; shift 2 ;;
    --page) page=${2:?$usage}; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
[[ $min_s =~ ^[0-9]+$ ]] || { echo "tune_suite.sh: --min-s takes a whole number, not '$min_s'" >&2; exit 2; }
[[ $page =~ ^[0-9]+$ ]] || { echo "tune_suite.sh: --page takes a whole number, not '$page'" >&2; exit 2; }
[[ $which == prefill || $which == decode ]] || { echo "tune_suite.sh: --suite is prefill or decode, not '$which'" >&2; exit 2; }
if [[ $which == decode ]]; then
  ((${#spaces[@]})) || spaces=(--space search_spaces/flash_decode.yaml)
else
  ((page == 0)) || { echo "tune_suite.sh: --page is for --suite decode" >&2; exit 2; }
  ((${#spaces[@]})) || spaces=(--space search_spaces/flash_fwd_mma.yaml)
fi
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
run_one() {  # campaign problem
  echo "== $1" >&2
  "$bin" tune "${spaces[@]}" --db "$db" --campaign "$1" --problem "$2" --budget-evals "$budget" "${extra[@]}"
  if [[ -n $export_dir ]]; then "$bin" export --db "$db" --campaign "$1" -o "$export_dir/$1.cu"; fi
  ran=$((ran + 1))
}
# name b h hkv s sk d dtype causal: the decode suite (bottom-right causal where s > 1).
decode=(
  "dec-b1-32k 1 32 8 1 32768 128 bf16 0"
  "dec-b16-8k 16 32 8 1 8192 128 bf16 0"
  "dec-b128-2k 128 32 8 1 2048 128 bf16 0"
  "dec-spec4 32 64 8 4 4096 128 bf16 1"
  "dec-mha-d64 64 16 16 1 4096 64 fp16 0"
)
if [[ $which == decode ]]; then
  for entry in "${decode[@]}"; do
    read -r name b h hkv s sk d dtype causal <<<"$entry"
    [[ -n $only && $name != "$only" ]] && continue
    problem="b=$b,h=$h,hkv=$hkv,s=$s,sk=$sk,d=$d,dtype=$dtype,causal=$causal"
    if ((page > 0)); then run_one "$name-p$page" "$problem,page=$page"; else run_one "$name" "$problem"; fi
  done
  ((ran)) || { echo "tune_suite.sh: no decode suite row matches (--only '$only')" >&2; exit 2; }
  "$bin" campaigns --db "$db"
  exit 0
fi
for dtype in $dtypes; do
  for entry in "${suite[@]}"; do
    read -r name b h s d causal <<<"$entry"
    [[ -n $only && $name != "$only" ]] && continue
    ((s >= min_s)) || continue
    run_one "$name-$dtype" "b=$b,h=$h,s=$s,d=$d,dtype=$dtype,causal=$causal"
  done
done
((ran)) || { echo "tune_suite.sh: no suite shape matches (--only '$only', --min-s $min_s)" >&2; exit 2; }
"$bin" campaigns --db "$db"
