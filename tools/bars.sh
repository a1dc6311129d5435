#!/usr/bin/env bash
# An issue's bars in one GPU call: a set of model-like problems tuned, the prefill winners exported
# in one file and timed against FlashAttention-4 and the other peers in one process, and each decode
# winner's bytes per second (beside its floor where the set names one). Sets:
#   variants  issue 41's (docs/design/variants.md keeps the verdicts; docs/log/PERFORMANCE.md runs
#             151-153 the first measurement): gpt-oss, Mistral and Gemma-2-like windows, sinks and
#             soft-caps; the floor of a windowed decode is the same call over the window's keys.
#   headdims  issue 44's (docs/design/head_dims.md): Phi-3-mini-like d=96 prefill (causal and not)
#             and decode.
#
#   tools/bars.sh DB OUT_DIR [--set variants|headdims] [--prefill-seconds N] [--decode-seconds N]
#                 [--only prefill|decode]
#
# On the GPU machine: ATTNTUNE_BIN picks the binary (default build/attntune); the FA4 peer needs the
# kit (../shared/peers/fa4, README "Variants") with its scripts in $FA4_KIT (default .fa4) and the
# kernels built for these problems in $FA4_AOT (default .fa4var/aot):
#   ~/.cache/fa4kit/venv/bin/python .fa4/build_aot.py --out .fa4var/aot --suite none \
#     --problem b=1,h=64,hkv=8,s=8192,sk=8192,d=64,dtype=bf16,causal=1,wl=127,sinks=1 ...
# (the kit spells a window wl=L and wr=R). The kit's compare.py skips ours on variant problems and has no
# flex contender: apply tools/fa4_variants.patch to the copy first (patch -d .fa4 -p1 < tools/fa4_variants.patch;
# docs/EXPORT.md lists the kit patches). Prefill campaigns go in DB, decode ones in DB-decode.db
# (DB without its .db); re-running resumes each campaign. Writes OUT_DIR/bars.cu,
# OUT_DIR/compare.log and prints a short table last.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: tools/bars.sh DB OUT_DIR [--set variants|headdims] [--prefill-seconds N] [--decode-seconds N] [--only prefill|decode]"
db=${1:?$usage}
out=${2:?$usage}
shift 2
A=${ATTNTUNE_BIN:-build/attntune}
kit=${FA4_KIT:-.fa4}
aot=${FA4_AOT:-.fa4var/aot}
pre_s=60 dec_s=15 only="" set=variants
while (($#)); do
  case $1 in
    --prefill-seconds) pre_s=${2:?$usage}; shift 2 ;;
    --decode-seconds) dec_s=${2:?$usage}; shift 2 ;;
    --only) only=${2:?$usage}; shift 2 ;;
    --set) set=${2:?$usage}; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
# The decode campaigns in a database of their own, so that the prefill one exports (--all-best) the
# prefill winners alone.
decode_db=${db%.db}-decode.db

case $set in
variants)
  # name|problem: gpt-oss-20b (64/8, d=64, sinks; window 128 = 127 keys back), Mistral-7B-v0.1 (32/8,
  # d=128, window 4096), Gemma-2-9B (16/8, d=256, soft-cap 50, window 4096 on half the layers).
  prefill=(
    "goss-w128-b1|b=1,h=64,hkv=8,s=8192,sk=8192,d=64,dtype=bf16,causal=1,window=127,sinks=1"
    "goss-w128-b8|b=8,h=64,hkv=8,s=8192,sk=8192,d=64,dtype=bf16,causal=1,window=127,sinks=1"
    "goss-full-b1|b=1,h=64,hkv=8,s=8192,sk=8192,d=64,dtype=bf16,causal=1,sinks=1"
    "mistral-w4k|b=1,h=32,hkv=8,s=16384,sk=16384,d=128,dtype=bf16,causal=1,window=4095"
    "gemma-cap|b=1,h=16,hkv=8,s=8192,sk=8192,d=256,dtype=bf16,causal=1,softcap=50"
    "gemma-cap-w4k|b=1,h=16,hkv=8,s=8192,sk=8192,d=256,dtype=bf16,causal=1,window=4095,softcap=50"
  )
  # A window's floor ("-only"): the same call over the window's keys alone (sk = s + 127).
  decode=(
    "gd-full-s1|b=64,h=64,hkv=8,s=1,sk=32768,d=64,dtype=bf16,causal=0,sinks=1,page=16"
    "gd-full-s4|b=64,h=64,hkv=8,s=4,sk=32768,d=64,dtype=bf16,causal=1,sinks=1,page=16"
    "gd-w128-s1|b=64,h=64,hkv=8,s=1,sk=32768,d=64,dtype=bf16,causal=1,window=127,sinks=1,page=16"
    "gd-only-s1|b=64,h=64,hkv=8,s=1,sk=128,d=64,dtype=bf16,causal=1,sinks=1,page=16"
    "gd-w128-s4|b=64,h=64,hkv=8,s=4,sk=32768,d=64,dtype=bf16,causal=1,window=127,sinks=1,page=16"
    "gd-only-s4|b=64,h=64,hkv=8,s=4,sk=131,d=64,dtype=bf16,causal=1,sinks=1,page=16"
    "md-w4k-32k|b=16,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=1,window=4095,page=16"
    "md-w4k-4k|b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,window=4095,page=16"
    "gem-dec|b=16,h=16,hkv=8,s=1,sk=8192,d=256,dtype=bf16,causal=0,softcap=50,page=16"
  )
  ;;
headdims)
  # Phi-3-mini (32 heads, MHA, d=96 = 3072 / 32): prefill s=4096 causal and not; decode b=16 at 8k
  # keys, pages of 16 (the bar: 2.8 TB/s on an H100, 0.84 of its peak).
  prefill=(
    "phi3-d96-causal|b=1,h=32,hkv=32,s=4096,sk=4096,d=96,dtype=bf16,causal=1"
    "phi3-d96|b=1,h=32,hkv=32,s=4096,sk=4096,d=96,dtype=bf16,causal=0"
  )
  decode=(
    "phi3-dec-8k|b=16,h=32,hkv=32,s=1,sk=8192,d=96,dtype=bf16,causal=0,page=16"
  )
  ;;
*) echo "$usage" >&2; exit 2 ;;
esac

tune() {  # space seconds name problem
  "$A" tune --db "$db" --space "$1" --problem "$4" --campaign "$3" --budget-time "$2s" \
    --final-top 4 --final-rounds 3 --final-min-seconds 0.5 --log-interval 30 > "$out/tune_$3.log" 2>&1 ||
    echo "tune $3 failed (exit $?): $(tail -1 "$out/tune_$3.log")" >&2
}

summary=()
if [[ $only != decode ]]; then
  for e in "${prefill[@]}"; do tune search_spaces/flash_fwd_wgmma.yaml "$pre_s" "${e%%|*}" "${e#*|}"; done
  "$A" export --db "$db" --all-best -o "$out/bars.cu"
  python3 "$kit/compare.py" "$out/bars.cu" --aot "$aot" --contenders ours,fa4,cudnn,flex \
    > "$out/compare.log" 2>&1 || echo "compare.py failed: $(tail -3 "$out/compare.log")" >&2
  summary+=("$(grep -A8 '=== forward' "$out/compare.log" || true)")
fi
if [[ $only != prefill ]]; then
  db=$decode_db
  for e in "${decode[@]}"; do tune search_spaces/flash_decode.yaml "$dec_s" "${e%%|*}" "${e#*|}"; done
  table=$(printf '%-12s %10s %8s\n' campaign "median us" "GB/s")
  for e in "${decode[@]}"; do
    n=${e%%|*}
    row=$("$A" best --db "$db" --campaign "$n" --format csv | sed -n 2p) || continue
    IFS=, read -r _ _ _ _ _ us _ _ _ _ _ gbps <<<"$(sed 's/"[^"]*"/x/g' <<<"$row")"
    table+=$'\n'"$(printf '%-12s %10.2f %8.0f' "$n" "$us" "$gbps")"
  done
  summary+=("$table")
fi
printf '%s\n\n' "${summary[@]}"
