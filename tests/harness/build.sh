#!/usr/bin/env bash
# Builds harness binaries for a list of configs: NAME:BM:BN:W:ST:QR:MB:FP:LR:SCHED:SUBN:D:BF16:CAUSAL (SCHED 0 interleaved, 1 blockwise)
set -e
out=${OUT_DIR:-build-harness}; mkdir -p $out
here=$(dirname "$0")
build_one() {
  IFS=: read name bm bn w st qr mb fp lr sched subn d bf causal <<<"$1"
  nvcc -std=c++17 -O3 -arch=sm_90 -DATT_HEAD_DIM=$d -DATT_DTYPE_BF16=$bf -DATT_CAUSAL=$causal \
    -DBLOCK_M=$bm -DBLOCK_N=$bn -DWARPS=$w -DKV_STAGES=$st -DQ_IN_REGS=$qr -DMIN_BLOCKS=$mb -DFRAG_PREFETCH=$fp -DLAZY_RESCALE=$lr \
    -DKV_SCHEDULE_INTERLEAVED=0 -DKV_SCHEDULE_BLOCKWISE=1 -DKV_SCHEDULE=$sched -DSUB_N=$subn \
    -DTHREADS=$((w*32)) -DSMEM_BYTES=$(((bm + 2*st*bn)*d*2)) $here/mma_harness.cu -o $out/$name
}
export -f build_one; export out here
printf '%s\n' "$@" | xargs -P ${JOBS:-2} -I{} bash -c 'build_one {}'
