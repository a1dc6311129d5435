#!/usr/bin/env bash
# Builds harness binaries for a list of configs: NAME:BM:BN:W:ST:QR:MB:FP:LR:SCHED:SUBN:D:BF16:CAUSAL[:WINDOW:SOFTCAP:SINKS[:NEWTON]]
# (SCHED 0 interleaved, 1 blockwise; WINDOW, SOFTCAP, SINKS 0/1 build the variants, whose values
# mma_harness takes per shape; NEWTON 0/1 forces the soft-cap's tanh (traits.cuh, kSoftcapNewton),
# absent: the kernel's choice; ARCH=sm_80.. picks the target, default sm_90)
set -e
out=${OUT_DIR:-build-harness}; mkdir -p $out
here=$(dirname "$0")
build_one() {
  IFS=: read name bm bn w st qr mb fp lr sched subn d bf causal window softcap sinks newton <<<"$1"
  nvcc -std=c++17 -O3 -arch=${ARCH:-sm_90} -DATT_HEAD_DIM=$d -DATT_DTYPE_BF16=$bf -DATT_CAUSAL=$causal \
    -DATT_WINDOW=${window:-0} -DATT_SOFTCAP=${softcap:-0} -DATT_SINKS=${sinks:-0} \
    ${newton:+-DATT_SOFTCAP_NEWTON=$newton} \
    -DBLOCK_M=$bm -DBLOCK_N=$bn -DWARPS=$w -DKV_STAGES=$st -DQ_IN_REGS=$qr -DMIN_BLOCKS=$mb -DFRAG_PREFETCH=$fp -DLAZY_RESCALE=$lr \
    -DKV_SCHEDULE_INTERLEAVED=0 -DKV_SCHEDULE_BLOCKWISE=1 -DKV_SCHEDULE=$sched -DSUB_N=$subn \
    -DTHREADS=$((w*32)) -DSMEM_BYTES=$(((bm + 2*st*bn)*d*2)) $here/mma_harness.cu -o $out/$name
}
export -f build_one; export out here ARCH
printf '%s\n' "$@" | xargs -P ${JOBS:-2} -I{} bash -c 'build_one {}'
