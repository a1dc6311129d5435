#!/usr/bin/env bash
# An issue's bars in one GPU call: a set of model-like problems tuned, the prefill winners exported
# in one file and timed against FlashAttention-4 and the other peers in one process, and each decode
# winner's bytes per second (beside its floor where the set names one). Sets:
#   variants  issue 41's (docs/design/variants.md keeps the verdicts; docs/log/PERFORMANCE.md runs
#             151-153 the first measurement): gpt-oss, Mistral and Gemma-2-like windows, sinks and
#             soft-caps; the floor of a windowed decode is the same call over the window's keys.
#   headdims  issue 44's (docs/design/head_dims.md): Phi-3-mini-like d=96 prefill (causal and not)
#             and decode.
#   backward  issue 45's (docs/design/backward.md): the backward pass (pass=bwd) of the prefill suite's
#             shapes with s >= 2048 (d=64 and 128, causal and not) in bf16 and fp16, and d=256 at b1
#             s8k; each tuned over every backward family (`tune` without --space), the winners
#             exported as a PyTorch package a dtype and timed through autograd beside FA4's sm90
#             backward, SDPA's cuDNN and flash backends (tools/compare_bwd.py, one process, checked
#             against float64 first). FA4's kernels (FA4_AOT, default .fa4/aotbars; FA4_KIT's
#             fa4kit.py with tools/fa4_bwd.patch applied) are built on the CPU machine first:
#   ~/.cache/fa4kit/venv/bin/python .fa4/build_aot.py --out .fa4/aotbars --suite none \
#     $(ATTNTUNE_BARS_LIST=1 tools/bars.sh - - --set backward | sed 's/,pass=bwd//; s/^/--bwd-problem /')
#   fa2bwd    issue 45's bar for the FlashAttention-2-class family (flash_bwd_mma, the L4's and A100's
#             backward): the backward set's d=64 and d=128 shapes in both dtypes, each tuned over
#             flash_bwd_mma alone (--space), the winners exported a dtype and timed through autograd
#             beside SDPA's flash backend (FlashAttention-2, the bar's 1.1x) and cuDNN by
#             tools/compare_bwd.py (no FA4). Give it a database of its own: the export takes every
#             backward winner the database holds.
#   fp8       issue 42's (docs/design/flash_fwd_wgmma.md, flash_decode's README "FP8 caches"): the
#             decode rows of tools/fp8_decode_peers.py (b16-8k, b64-8k, b128-2k, b1-32k, spec4, q8,
#             q16; pages of 16) and its chunked-prefill row (b4 h32/8 s2048 sk10240), each tuned twice
#             (`tune` without --space: every family that serves it), over an FP8 cache (kv_dtype=fp8)
#             and over a bf16 one, --decode-seconds / --prefill-seconds each; the winners exported as
#             one PyTorch package and timed by fp8_decode_peers.py --check (one process, FP8 beside
#             our bf16 kernel, SDPA's backends and FA4's dense kernels over the bf16 cache where
#             $FA4_AOT, default .fa4/aot, has them: build them with the rows' problems,
#               ATTNTUNE_BARS_LIST=1 tools/bars.sh - - --set fp8 | sed 's/,page=16,kv_dtype=fp8//; s/^/--problem /';
#             its table last). PYTHON picks the interpreter that has torch.
#   fp8fwd    issue 42's FP8 forward (docs/design/flash_fwd_wgmma.md "The FP8 forward"): b1 h16 s16k at
#             d=128 and d=256, causal and not, each tuned twice over flash_fwd_wgmma (dtype=fp8 and its
#             bf16 twin), --prefill-seconds each; the winners exported in one file and timed by
#             tools/compare_fp8_forward.py a row (correctness at s=sk=777 first; FP8 beside our bf16
#             kernel, FA4's bf16 and SDPA in one process; FA4's kernels from $FA4_AOT, default the
#             kit's .fa4/aot, whose prefill suite has these d=128 shapes). A row the space does not
#             serve yet (d=256) is reported by its failed tune and skipped. Run 255 ran this by hand.
#   unseen    issue 43's (docs/design/shipped_db.md): 10 prefill shapes outside the suite and the
#             shipped plan (odd head counts, lengths 512-32k, causal and not, chunked prefill), each
#             tuned by the default main job (`tune` without --space: every template, warm-started
#             from the shipped database, --budget-evals 200, the default final re-timing) once a
#             seed; seed 1's winners exported and timed against FA4 and cuDNN; for every campaign
#             its pick re-timed beside its top 20 (`retime`: within 1%?), and the evaluations until
#             the search's best so far, as re-timed there, came within 2% of the fastest of them
#             (the transfer from the shipped database; judged by re-timed times, since search
#             medians read 4-13% fast and unevenly). Each campaign has a database of its own
#             (DB-NAME-sN.db: a new user's, with the shipped file alone to warm-start from; the
#             compare phase merges seed 1's for the export), and its tune log is appended to, so a
#             resumed campaign keeps its warm start's line. Its (seed, shape) campaigns are spread over
#             --devices, costliest first (a two-GPU machine halves the wall time, at one seed
#             too); re-running resumes the campaigns and skips the re-timings done. The
#             databases hold each build's cubin (80+ MB after a tune phase): tools/gpu_box.sh runs a
#             phase in a box of one call and brings them back without it (resuming re-compiles what it
#             needs), then restores them on the next machine (README, "On the GPU machine"). On the GPU machine keep DB and OUT_DIR
#             under a folder git ignores (.gpu-work/): between calls the machine's copy of the tree
#             drops untracked files that git does not ignore (run 273 lost its logs that way, and
#             would have lost its re-timings). Runs 271-273's tuned databases and logs are committed:
#               mkdir -p .gpu-work && tar -C .gpu-work -xJf docs/log/data/unseen-271-273.tar.xz
#               tools/bars.sh .gpu-work/unseen/u.db .gpu-work/unseen --set unseen --seeds 2 \
#                 --devices 0,1 --phase retime     # then --phase compare (FA4_AOT: below)
#
#   tools/bars.sh DB OUT_DIR [--set variants|headdims|backward|fa2bwd|fp8|fp8fwd|unseen] [--prefill-seconds N] [--decode-seconds N]
#                 [--only prefill|decode] [--seeds N] [--devices LIST] [--budget N] [--retime-seconds S] [--shapes NAME,...]
#                 [--phase tune|retime|compare|table|transfer|all]
#
# unseen, on the GPU machine: the FA4 kernels for its problems built on the CPU machine first
# (FA4_AOT=.fa4un/aot; ATTNTUNE_BARS_LIST=1 lists the set's problems, one a line):
#   ~/.cache/fa4kit/venv/bin/python .fa4/build_aot.py --out .fa4un/aot --suite none \
#     $(ATTNTUNE_BARS_LIST=1 tools/bars.sh - - --set unseen | sed 's/^/--problem /')
# --phase splits the work over GPU calls (tune, then retime, then compare; each resumes what is
# done); table prints the table from what OUT_DIR holds. unseen's `--phase transfer` (not in `all`)
# measures the transfer bar again after the shipped file or the warm start changed, without a main
# job a shape: tools/transfer_check.py, each shape's 5-evaluation campaign from the shipped file
# alone timed beside seed 1's pick of the tune phase (~1 GPU minute a shape, split over --devices). --retime-seconds: each re-timing's least
# sampling time (retime's --min-seconds; default 1).
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
usage="usage: tools/bars.sh DB OUT_DIR [--set variants|headdims|backward|fa2bwd|fp8|fp8fwd|unseen] [--prefill-seconds N] [--decode-seconds N] [--only prefill|decode] [--seeds N] [--devices LIST] [--budget N] [--retime-seconds S] [--shapes NAME,...] [--phase tune|retime|compare|table|transfer|all]"
db=${1:?$usage}
out=${2:?$usage}
shift 2
A=${ATTNTUNE_BIN:-build/attntune}
kit=${FA4_KIT:-.fa4}
aot=${FA4_AOT:-.fa4var/aot}
pre_s=60 dec_s=15 only="" set=variants seeds=2 devices=0 budget=200 retime_s=1 phase=all shapes=""
while (($#)); do
  case $1 in
    --seeds) seeds=${2:?$usage}; shift 2 ;;
    --devices) devices=${2:?$usage}; shift 2 ;;
    --budget) budget=${2:?$usage}; shift 2 ;;
    --retime-seconds) retime_s=${2:?$usage}; shift 2 ;;
    --phase) phase=${2:?$usage}; shift 2 ;;
    --prefill-seconds) pre_s=${2:?$usage}; shift 2 ;;
    --decode-seconds) dec_s=${2:?$usage}; shift 2 ;;
    --only) only=${2:?$usage}; shift 2 ;;
    --set) set=${2:?$usage}; shift 2 ;;
    --shapes) shapes=${2:?$usage}; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[[ ${ATTNTUNE_BARS_LIST:-} == 1 ]] || mkdir -p "$out"
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
backward|fa2bwd)
  # The prefill suite's shapes with s >= 2048 (../shared/peers), both dtypes; Gemma-2/3's d=256 (the
  # backward set's: the FA2-class bar names d=64 and 128).
  prefill=()
  for dt in bf16 fp16; do
    for c in 0 1; do
      prefill+=("bwd-b8-s2k-d64-c$c-$dt|b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=$dt,causal=$c,pass=bwd"
                "bwd-b4-s4k-d128-c$c-$dt|b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=$dt,causal=$c,pass=bwd"
                "bwd-b1-s16k-d128-c$c-$dt|b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=$dt,causal=$c,pass=bwd")
    done
  done
  [[ $set == backward ]] &&
    prefill+=("bwd-b1-s8k-d256-c0-bf16|b=1,h=16,hkv=16,s=8192,sk=8192,d=256,dtype=bf16,causal=0,pass=bwd"
              "bwd-b1-s8k-d256-c1-bf16|b=1,h=16,hkv=16,s=8192,sk=8192,d=256,dtype=bf16,causal=1,pass=bwd")
  decode=()
  only=prefill
  aot=${FA4_AOT:-.fa4/aotbars}
  ;;
fp8)
  # name|problem (the bf16 cache's twin is the problem without ,kv_dtype=fp8): fp8_decode_peers.py's
  # rows, names and shapes as there (tests/unit/cli/test_bars.cpp holds them to it).
  prefill=("chunk|b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8")
  decode=(
    "b16-8k|b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8"
    "b64-8k|b=64,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8"
    "b128-2k|b=128,h=32,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8"
    "b1-32k|b=1,h=32,hkv=8,s=1,sk=32768,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8"
    "spec4|b=32,h=64,hkv=8,s=4,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8"
    "q8|b=32,h=32,hkv=8,s=8,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8"
    "q16|b=32,h=32,hkv=8,s=16,sk=4096,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8"
  )
  aot=${FA4_AOT:-.fa4/aot}
  ;;
fp8fwd)
  # name|problem (its bf16 twin: dtype=bf16): issue 42's FP8-forward rows.
  prefill=(
    "fwd8-d128|b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=fp8,causal=0"
    "fwd8-d128-causal|b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=fp8,causal=1"
    "fwd8-d256|b=1,h=16,hkv=16,s=16384,sk=16384,d=256,dtype=fp8,causal=0"
    "fwd8-d256-causal|b=1,h=16,hkv=16,s=16384,sk=16384,d=256,dtype=fp8,causal=1"
  )
  decode=()
  only=prefill
  aot=${FA4_AOT:-.fa4/aot}
  ;;
unseen)
  # Not in the suite nor in tools/shipped_plan.py's plan (checked by tests/unit/cli/test_bars.cpp):
  # Qwen2.5-7B-like 28/4, 40/8 and 56/8 GQA, 20/20 MHA at d=64, 24/8; odd lengths; two chunked
  # prefills (a chunk of queries over a longer cache, bottom-right causal).
  prefill=(
    "u-q28-6k|b=1,h=28,hkv=4,s=6000,sk=6000,d=128,dtype=bf16,causal=1"
    "u-40-4k-b2|b=2,h=40,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1"
    "u-20-1000-b4|b=4,h=20,hkv=20,s=1000,sk=1000,d=64,dtype=bf16,causal=0"
    "u-40-32k|b=1,h=40,hkv=8,s=32768,sk=32768,d=128,dtype=bf16,causal=1"
    "u-q28-2k-b8|b=8,h=28,hkv=4,s=2048,sk=2048,d=128,dtype=bf16,causal=0"
    "u-20-12k|b=1,h=20,hkv=20,s=12000,sk=12000,d=64,dtype=bf16,causal=1"
    "u-56-6k-b2|b=2,h=56,hkv=8,s=6000,sk=6000,d=128,dtype=bf16,causal=1"
    "u-q28-chunk|b=1,h=28,hkv=4,s=1536,sk=9728,d=128,dtype=bf16,causal=1"
    "u-40-chunk-b4|b=4,h=40,hkv=8,s=512,sk=4608,d=128,dtype=bf16,causal=1"
    "u-24-16k|b=1,h=24,hkv=8,s=16384,sk=16384,d=128,dtype=bf16,causal=0"
  )
  decode=()
  only=prefill
  ;;
*) echo "$usage" >&2; exit 2 ;;
esac
[[ $seeds =~ ^[1-9][0-9]*$ && $budget =~ ^[1-9][0-9]*$ ]] || { echo "$usage" >&2; exit 2; }
# --shapes: only the named rows of the set (a session with one GPU takes the set in parts; each phase
# resumes what is done). An unknown name is refused with the set's names, before anything runs.
if [[ -n $shapes ]]; then
  keep_p=() keep_d=()
  IFS=, read -r -a want <<<"$shapes"
  for w in "${want[@]}"; do
    hit=0
    for e in "${prefill[@]}"; do [[ ${e%%|*} == "$w" ]] && keep_p+=("$e") && hit=1; done
    for e in "${decode[@]}"; do [[ ${e%%|*} == "$w" ]] && keep_d+=("$e") && hit=1; done
    ((hit)) || { echo "bars.sh: error: --shapes: no row named '$w' in set $set (its rows:$(for e in "${prefill[@]}" "${decode[@]}"; do printf ' %s' "${e%%|*}"; done))" >&2; exit 2; }
  done
  prefill=("${keep_p[@]}") decode=("${keep_d[@]}")
fi
case $phase in tune|retime|compare|table|transfer|all) ;; *) echo "$usage" >&2; exit 2 ;; esac
if [[ ${ATTNTUNE_BARS_LIST:-} == 1 ]]; then  # the set's problems, one a line (tests/unit/cli/test_bars.cpp)
  for e in "${prefill[@]}" "${decode[@]}"; do echo "${e#*|}"; done
  exit 0
fi

# The variants set's prefill compare needs the kit's compare.py with tools/fa4_variants.patch applied:
# unpatched, it skips ours on every variant problem and prints a table of dashes after the tuning has
# spent the GPU time (run 279's first call). Refused before anything runs.
if [[ $set == variants && $only != decode ]] && ! grep -q "def make_flex" "$kit/compare.py" 2>/dev/null; then
  echo "bars.sh: error: $kit/compare.py (FA4_KIT) has no variants support: apply tools/fa4_variants.patch to the kit's" \
    "copy first (patch -d $kit -p1 < tools/fa4_variants.patch), or point FA4_KIT at a patched copy" >&2
  exit 2
fi

# The unseen set: each campaign in a database of its own, DB-NAME-sN.db (seed N), which holds what a
# new user's database would: nothing but the shipped file to warm-start from. (Runs 251-253 kept a
# seed's campaigns in one database, DB-sN.db, seed 1's in DB itself; then every shape but the first of
# its head dim warm-started from the set's own earlier campaigns, and the transfer from the shipped
# file was measured on 2 shapes of 10. Such databases are still read: campaign_db falls back to them;
# two devices may then write one database at once, which SQLite's locking serialises.)
seed_db() { if (($1 == 1)); then echo "$db"; else echo "${db%.db}-s$1.db"; fi; }
own_db() { echo "${db%.db}-$2-s$1.db"; }  # seed name
campaign_db() {  # seed name: the campaign's own database, else (an older run's) its seed's
  if [[ -e $(own_db "$1" "$2") || ! -e $(seed_db "$1") ]]; then own_db "$1" "$2"; else seed_db "$1"; fi
}
IFS=, read -r -a devs <<<"$devices"
# A shape's work, roughly: one unit for the compiles of a campaign, and one more for each 10^12
# multiply-adds of a call (its timings). Only the balance between the devices reads it.
shape_cost() {  # problem
  local kv b=1 h=1 s=1 sk="" d=1 causal=0
  for kv in ${1//,/ }; do
    case ${kv%%=*} in b) b=${kv#*=} ;; h) h=${kv#*=} ;; s) s=${kv#*=} ;; sk) sk=${kv#*=} ;; d) d=${kv#*=} ;;
                      causal) causal=${kv#*=} ;; esac
  done
  echo $((1000 + b * h * s * ${sk:-$s} * d / (causal ? 2 : 1) / 1000000000))
}
on_devices() {  # fn: run "fn seed device entry" for every (seed, shape), spread over the devices at once
  # Each (seed, shape) goes to the device with the least work so far, the costliest first (shape_cost),
  # so one seed keeps every device busy (a device used to run whole seeds: a one-seed run left
  # the second GPU idle) and the long shapes do not pile up on one device. Each campaign has a
  # database of its own, so any split is safe; a device runs its share in turn.
  local k i j sd pids=() items=() load=()
  for ((sd = 1; sd <= seeds; sd++)); do
    for i in "${!prefill[@]}"; do items+=("$(shape_cost "${prefill[$i]#*|}") $sd $i"); done
  done
  local -a share
  for k in "${!devs[@]}"; do load[k]=0; share[k]=""; done
  while read -r c sd i; do
    j=0
    for k in "${!devs[@]}"; do ((load[k] < load[j])) && j=$k; done
    load[j]=$((load[j] + c)); share[j]+="$sd:$i "
  done < <(printf '%s\n' "${items[@]}" | sort -k1,1nr -k2,2n -k3,3n)
  for k in "${!devs[@]}"; do
    (
      for i in ${share[k]}; do "$1" "${i%%:*}" "${devs[$k]}" "${prefill[${i#*:}]}"; done
    ) &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || true; done
}
main_job() {  # seed device entry: the default main job of tools/run.sh for the shape
  local e=$3
  # The log is appended to: a resumed campaign's first lines (its warm start's source) stay.
  "$A" tune --db "$(campaign_db "$1" "${e%%|*}")" --problem "${e#*|}" --campaign "${e%%|*}" --seed "$1" \
    --budget-evals "$budget" --device "$2" --log-interval 60 >> "$out/tune_${e%%|*}_s$1.log" 2>&1 ||
    echo "tune ${e%%|*} seed $1 failed (exit $?): $(tail -1 "$out/tune_${e%%|*}_s$1.log")" >&2
}
retime_all() {  # seed device entry: the campaign's pick beside its top 20, long (skipped when done)
  local e=$3 f="$out/retime_${3%%|*}_s$1.json"
  [[ -s $f ]] && return 0
  "$A" retime --db "$(campaign_db "$1" "${e%%|*}")" --campaign "${e%%|*}" --top 20 --rounds 2 --min-seconds "$retime_s" \
    --device "$2" --format json > "$f.tmp" 2> "$out/retime_${e%%|*}_s$1.log" && mv "$f.tmp" "$f" ||
    echo "retime ${e%%|*} seed $1 failed: $(tail -1 "$out/retime_${e%%|*}_s$1.log")" >&2
}
# The table: per campaign, the evaluations to within 2% of its final best and whether the warm start
# came from the shipped database (its tune log says so), and the pick's distance from the re-timed
# fastest of its top 20; then the medians and counts the issue's bars read.
unseen_table() {
  python3 - "$out" "$seeds" "$db" "${prefill[@]}" <<'PY'
import json, os, sqlite3, statistics, sys
out, seeds, db, entries = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def seed_db(sd):
    return db if sd == 1 else (db[:-3] if db.endswith(".db") else db) + f"-s{sd}.db"
def campaign_db(sd, name):  # as the script's: the campaign's own database, else its seed's
    own = (db[:-3] if db.endswith(".db") else db) + f"-{name}-s{sd}.db"
    return own if os.path.exists(own) or not os.path.exists(seed_db(sd)) else seed_db(sd)
def canonical(family, config):
    return family + "|" + json.dumps(config, sort_keys=True, separators=(",", ":"))
# Transfer, judged by re-timed times: the search's best so far after each evaluation (by its search
# median), and the first evaluation whose best so far, re-timed beside the top 20 (the retime
# phase, one session of >= 1 s timings), lies within 2% of the fastest of them. Search timings read
# 4-13% fast and unevenly (runs 243-244), so a search median is no measure of "within 2%"; a best so far
# that was not among the re-timed configs counts as not within.
def evals_to_2pct(path, name, rt):
    if not rt or not os.path.exists(path):
        return None
    timed = {canonical(c["template"], c["config"]): c["median_us"] for c in rt.get("configs", [])
             if c.get("status") == "ok" and c.get("median_us")}
    if not timed:
        return None
    fastest = min(timed.values())
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("SELECT e.status, e.median_us, k.family, k.config FROM evaluations e JOIN campaigns c ON "
                       "c.id = e.campaign_id JOIN candidates k ON k.id = e.candidate_id WHERE c.name = ? AND "
                       "e.phase = 'search' ORDER BY e.id", (name,)).fetchall()
    con.close()
    best, key = None, None
    for n, (status, us, family, config) in enumerate(rows, 1):
        if status == "ok" and us is not None and (best is None or us < best):
            best, key = us, canonical(family, json.loads(config))
        if key in timed and timed[key] <= fastest * 1.02:
            return n
    return None
rows, to2, holds = [], [], []
for e in entries:
    name = e.split("|", 1)[0]
    cells = [name]
    for sd in range(1, seeds + 1):
        rt = load(f"{out}/retime_{name}_s{sd}.json")
        n2 = evals_to_2pct(campaign_db(sd, name), name, rt if isinstance(rt, dict) else None)
        if n2 is not None and sd == 1:
            to2.append(n2)
        log = f"{out}/tune_{name}_s{sd}.log"
        shipped = os.path.exists(log) and "of the shipped database" in open(log, errors="replace").read()
        behind = rt.get("pick_behind_pct") if isinstance(rt, dict) else None
        if behind is not None:
            holds.append(behind <= 1.0)
        cells.append(f"{'-' if n2 is None else n2}{'*' if shipped else ''}")
        cells.append("-" if behind is None else f"{behind:.2f}%")
    rows.append(cells)
head = ["campaign"] + [c for sd in range(1, seeds + 1) for c in (f"to 2% s{sd}", f"pick behind s{sd}")]
width = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
for r in [head] + rows:
    print("  ".join(str(c).rjust(w) for c, w in zip(r, width)))
print("(* warm-started from the shipped database; 'to 2%': evaluations until the search's best so far, re-timed beside")
print(" the top 20, came within 2% of the fastest of them (-: never, or not re-timed); 'pick behind': the exported pick")
print(" re-timed beside the fastest of its top 20)")
if to2:
    # A best so far outside the re-timed top 20 counts as not within: on long campaigns (254
    # evaluations, run 402's H100 seed 1: median 60) this reads far above --phase transfer's figure
    # (median 3 over five of the same shapes, run 404), which times the first evaluations themselves.
    print(f"transfer (seed 1): median {statistics.median(to2):g} evaluations to within 2% over {len(to2)} shapes "
          f"(bar: <= 5; counted among the re-timed top 20 only: --phase transfer times the first evaluations)")
if holds:
    print(f"robust pick: {sum(holds)} of {len(holds)} campaigns within 1% of their re-timed best (bar: >= 19 of 20)")
PY
}

if [[ $set == unseen && $phase == transfer ]]; then
  # The transfer bar again after a change to the shipped file or to the warm start, without a main
  # job a shape (tools/transfer_check.py): each shape's short campaign of 5 evaluations from the
  # shipped file alone, timed beside seed 1's pick (its campaign tuned by the tune phase), the shapes
  # split over --devices. Not part of `all`.
  pids=() k=0
  for dev in "${devs[@]}"; do
    args=()
    for i in "${!prefill[@]}"; do
      e=${prefill[$i]}
      ((i % ${#devs[@]} == k)) && args+=(--shape "${e%%|*}" "${e#*|}" "$(campaign_db 1 "${e%%|*}")")
    done
    ((${#args[@]})) && { ATTNTUNE_BIN=$A python3 tools/transfer_check.py "${args[@]}" --out "$out/transfer" \
      --device "$dev" --json "$out/transfer_d$dev.json" > "$out/transfer_d$dev.log" 2>&1 & pids+=($!); }
    k=$((k + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || echo "transfer_check.py on a device exited $? (its log in $out)" >&2; done
  python3 - "$out" <<'PY'
import glob, json, statistics, sys
rows = [r for f in sorted(glob.glob(f"{sys.argv[1]}/transfer_d*.json")) for r in json.load(open(f))]
for r in rows:
    n = r.get("evals_to_within")
    print(f"{r['name']:<16s} " + ("not measured" if not r.get("measured") else
          f"reference {r['reference']['median_us']:.1f} us, to within 2%: {'-' if n is None else n}"))
figs = [r["evals_to_within"] or 6 for r in rows if r.get("measured")]
if figs:
    print(f"transfer: median {statistics.median(figs):g} evaluations to within 2% over {len(figs)} shapes (6: not within 5; bar: <= 5)")
PY
  exit 0
fi
if [[ $set == unseen ]]; then
  [[ $phase == tune || $phase == all ]] && on_devices main_job
  [[ $phase == retime || $phase == all ]] && on_devices retime_all
  if [[ $phase == compare || $phase == all ]]; then
    # Seed 1's campaigns in one database for the export (merged from their own; an older run's are
    # in DB already).
    merged=$db
    own=()
    for e in "${prefill[@]}"; do [[ -e $(own_db 1 "${e%%|*}") ]] && own+=("$(own_db 1 "${e%%|*}")"); done
    if ((${#own[@]})); then
      merged="$out/seed1-merged.db"
      rm -f "$merged"
      "$A" merge "${own[@]}" -o "$merged" > /dev/null
    fi
    "$A" export --db "$merged" --all-best -o "$out/bars.cu"
    python3 "$kit/compare.py" "$out/bars.cu" --aot "$aot" --contenders ours,fa4,cudnn \
      > "$out/compare.log" 2>&1 || echo "compare.py failed: $(tail -3 "$out/compare.log")" >&2
    grep -A14 '=== forward' "$out/compare.log" || true
    echo
  fi
  unseen_table
  exit 0
fi

tune() {  # space seconds name problem (space "": every template's default space that serves it)
  "$A" tune --db "$db" ${1:+--space "$1"} --problem "$4" --campaign "$3" --budget-time "$2s" \
    --final-top 4 --final-rounds 3 --final-min-seconds 0.5 --log-interval 30 > "$out/tune_$3.log" 2>&1 ||
    echo "tune $3 failed (exit $?): $(tail -1 "$out/tune_$3.log")" >&2
}

if [[ $set == fp8 ]]; then
  # tune: each row over an FP8 cache and over a bf16 one (every family that serves it); compare: one
  # package of every winner, fp8_decode_peers.py over the rows asked (--only prefill|decode).
  rows=()
  [[ $only != decode ]] && rows+=("${prefill[@]}")
  [[ $only != prefill ]] && rows+=("${decode[@]}")
  if [[ $phase == tune || $phase == all ]]; then
    for e in "${rows[@]}"; do
      n=${e%%|*} p=${e#*|}
      secs=$dec_s
      [[ $n == chunk ]] && secs=$pre_s
      tune "" "$secs" "$n-fp8" "$p"
      tune "" "$secs" "$n-bf16" "${p%,kv_dtype=fp8}"
    done
  fi
  if [[ $phase == compare || $phase == all ]]; then
    names=$(for e in "${rows[@]}"; do echo "${e%%|*}"; done | paste -sd,)
    rm -rf "$out/pkg"
    "$A" export --db "$db" --all-best --dtype bf16 --no-shipped --torch "$out/pkg" > "$out/export.log" 2>&1 ||
      { echo "export failed: $(tail -1 "$out/export.log")" >&2; exit 1; }
    fa4=(--no-fa4)
    [[ -f $aot/manifest.json ]] && fa4=(--fa4-aot "$aot" --fa4-kit "$kit")
    PYTHONPATH="$out/pkg" "${PYTHON:-python3}" tools/fp8_decode_peers.py --rows "$names" --check "${fa4[@]}" \
      > "$out/peers.log" 2>&1 || echo "fp8_decode_peers.py failed: $(tail -3 "$out/peers.log")" >&2
    sed -n '/^row /,$p' "$out/peers.log"
  fi
  exit 0
fi

if [[ $set == fp8fwd ]]; then
  # tune: each row in dtype=fp8 and in bf16 (flash_fwd_wgmma, its default space); compare: one file of
  # every winner, compare_fp8_forward.py a row (its table last), the rows whose FP8 tune has a result.
  sp=search_spaces/flash_fwd_wgmma.yaml
  if [[ $phase == tune || $phase == all ]]; then
    for e in "${prefill[@]}"; do
      n=${e%%|*} p=${e#*|}
      tune "$sp" "$pre_s" "$n" "$p"
      tune "$sp" "$pre_s" "$n-bf16" "${p/dtype=fp8/dtype=bf16}"
    done
  fi
  if [[ $phase == compare || $phase == all ]]; then
    "$A" export --db "$db" --all-best --no-shipped -o "$out/bars.cu" > "$out/export.log" 2>&1 ||
      { echo "export failed: $(tail -1 "$out/export.log")" >&2; exit 1; }
    for e in "${prefill[@]}"; do
      n=${e%%|*} p=${e#*|}
      "$A" best --db "$db" --campaign "$n" --format csv > /dev/null 2>&1 || { echo "$n: no FP8 result (see $out/tune_$n.log)"; continue; }
      "${PYTHON:-python3}" tools/compare_fp8_forward.py --cu "$out/bars.cu" --problem "$p" --fa4-aot "$aot" \
        --fa4-kit "$kit" --json "$out/compare_$n.json" > "$out/compare_$n.log" 2>&1 ||
        echo "compare_fp8_forward.py $n failed: $(tail -3 "$out/compare_$n.log")" >&2
      sed -n '/^=== FP8 forward/,$p' "$out/compare_$n.log"
    done
  fi
  exit 0
fi

if [[ $set == backward || $set == fa2bwd ]]; then
  # tune: each problem over every backward family (the default spaces; fa2bwd: flash_bwd_mma's
  # alone), --prefill-seconds each; compare: a package a dtype, timed by compare_bwd.py beside FA4
  # (not for fa2bwd), cuDNN and FA2 (its table last).
  space="" peers=(--fa4-aot "$aot" --fa4-kit "$kit")
  [[ $set == fa2bwd ]] && space=search_spaces/flash_bwd_mma.yaml peers=()
  if [[ $phase == tune || $phase == all ]]; then
    for e in "${prefill[@]}"; do tune "$space" "$pre_s" "${e%%|*}" "${e#*|}"; done
  fi
  if [[ $phase == compare || $phase == all ]]; then
    for dt in bf16 fp16; do
      shapes=$(for e in "${prefill[@]}"; do echo "${e#*|}"; done | python3 -c '
import sys
rows = []
for line in sys.stdin:
    kv = dict(x.split("=", 1) for x in line.strip().split(","))
    if kv["dtype"] == sys.argv[1]:
        rows.append(",".join(kv[k] for k in ("b", "h", "hkv", "s", "d", "causal")))
print(";".join(rows))' "$dt")
      [[ -n $shapes ]] || continue
      rm -rf "$out/pkg_$dt"
      "$A" export --db "$db" --all-best --dtype "$dt" --torch "$out/pkg_$dt" > "$out/export_$dt.log" 2>&1 ||
        { echo "export $dt failed: $(tail -1 "$out/export_$dt.log")" >&2; continue; }
      PYTHONPATH="$out/pkg_$dt" "${PYTHON:-python3}" tools/compare_bwd.py --shapes "$shapes" --dtype "$dt" \
        "${peers[@]}" > "$out/compare_bwd_$dt.log" 2>&1 ||
        echo "compare_bwd.py $dt failed: $(tail -3 "$out/compare_bwd_$dt.log")" >&2
    done
    for dt in bf16 fp16; do
      [[ -f $out/compare_bwd_$dt.log ]] && sed -n '/^GPU after/,$p' "$out/compare_bwd_$dt.log"
    done
  fi
  exit 0
fi

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
