#!/usr/bin/env bash
# Builds bwd_harness shared libraries for a list of configs: NAME:D:BF16:CAUSAL:WINDOW:BM:W:KT:ST:MB[:QUAD[:PAIRS[:DQROWS[:LF]]]]
# (flash_bwd_mma's tunables: block_m, warps, key_tiles, q_stages, min_blocks, dq_reduce 0 pair / 1 quad / 2 vec4 / 3 frag / 4 frag4, kv_pairs 0 / 1, dq_rows 16 / 32, longest_first 0 / 4 / 16; ARCH=sm_80.. picks the
# target, default sm_90). tests/harness/bwd_check.py loads them.
set -e
out=${OUT_DIR:-build-harness}; mkdir -p $out
here=$(dirname "$0")
build_one() {
  IFS=: read name d bf causal window bm w kt st mb quad pairs dqrows lf <<<"$1"
  local bn=$((w * 16 * kt)) dp=$((d <= 64 ? 64 : d <= 128 ? 128 : 256))  # the padded head dim (D_PAD)
  local pw=$((${pairs:-0} ? 2 : 1))  # kv_pairs: P^T's tile beside dS^T's
  nvcc -std=c++17 -O3 $EXTRA -arch=${ARCH:-sm_90} -shared -Xcompiler -fPIC -Xptxas -v \
    -DATT_HEAD_DIM=$d -DD_PAD=$dp -DATT_DTYPE_BF16=$bf -DATT_CAUSAL=$causal -DATT_WINDOW=$window \
    -DBLOCK_M=$bm -DWARPS=$w -DKEY_TILES=$kt -DQ_STAGES=$st -DMIN_BLOCKS=$mb -DDQ_REDUCE_PAIR=0 -DDQ_REDUCE_QUAD=1 -DDQ_REDUCE_VEC4=2 -DDQ_REDUCE_FRAG=3 -DDQ_REDUCE_FRAG4=4 -DDQ_REDUCE=${quad:-0} -DKV_PAIRS=${pairs:-0} -DDQ_ROWS=${dqrows:-16} -DLONGEST_FIRST=${lf:-0} -DTHREADS=$((w * 32)) \
    -DSMEM_BYTES=$(((2 * bn * dp + 2 * st * bm * dp + pw * bn * bm) * 2 + 2 * st * bm * 4)) \
    $here/bwd_harness.cu -o $out/lib$name.so 2> $out/$name.ptxas
  echo "$name: $(awk '/Function properties for flash_bwd_mma$/{f=1} f&&/spill stores/{printf "%s spilled, ", $5} f&&/Used/{print $5, "registers"; f=0}' $out/$name.ptxas)"
}
export -f build_one; export out here ARCH EXTRA
printf '%s\n' "$@" | xargs -P ${JOBS:-2} -I{} bash -c 'build_one {}'
