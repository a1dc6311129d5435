#!/usr/bin/env bash
# Builds wgmma_harness binaries (sm_90a) for a list of configs and keeps ptxas's report of each:
#   NAME:D:BF16:CAUSAL:BM:BN:STAGES:WS:PP:OV:PRODUCER_REGS:CONSUMER_REGS[:EXP2_EMU[:MACRO=V,...]]
# (the last field: extra -D definitions, e.g. HEAD_GROUP=4,NARROW_N=64,LAZY_RESCALE=8,SPLIT_TAIL=1,PERSISTENT=1,KV_MULTICAST=1; they default to 1, 0, 0, 0, 0 and 0;
# PERSISTENT=1 builds causal configs with a producer for the dynamic tile counter: run them persistent;
# ATT_WINDOW=1, ATT_SOFTCAP=1, ATT_SINKS=1 build the variants, sized at run time by WGMMA_WINDOW=L[,R]
# and WGMMA_SOFTCAP=C, wgmma_harness.cu)
# OUT_DIR (default build-wgmma-harness) receives NAME and NAME.ptxas.
set -e
out=${OUT_DIR:-build-wgmma-harness}; mkdir -p $out
here=$(dirname "$0")
build_one() {
  IFS=: read name d bf causal bm bn st ws pp ov preg creg emu xdef <<<"$1"
  local extra=""; [ -n "$xdef" ] && extra=$(tr ',' '\n' <<<"$xdef" | sed 's/^/-D/' | tr '\n' ' ')
  grep -q "HEAD_GROUP=" <<<"$xdef" || extra="$extra -DHEAD_GROUP=1"
  grep -q "NARROW_N=" <<<"$xdef" || extra="$extra -DNARROW_N=0"
  grep -q "LAZY_RESCALE=" <<<"$xdef" || extra="$extra -DLAZY_RESCALE=0"
  grep -q "SPLIT_TAIL=" <<<"$xdef" || extra="$extra -DSPLIT_TAIL=0"
  grep -q "PERSISTENT=" <<<"$xdef" || extra="$extra -DPERSISTENT=0"
  grep -q "KV_MULTICAST=" <<<"$xdef" || extra="$extra -DKV_MULTICAST=0"
  local threads=$(( bm * 2 + (ws ? 128 : 0) ))
  local smem=$(( (bm + 2 * st * bn) * d * 2 + 256 + 1024 ))
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
    -DATT_HEAD_DIM=$d -DATT_DTYPE_BF16=$bf -DATT_CAUSAL=$causal -DBLOCK_M=$bm -DBLOCK_N=$bn -DSTAGES=$st \
    -DWARP_SPECIALIZE=$ws -DPING_PONG=$pp -DINTRA_WG_OVERLAP=$ov -DPRODUCER_REGS=$preg -DCONSUMER_REGS=$creg -DEXP2_EMU=${emu:-0} \
    -DTHREADS=$threads -DSMEM_BYTES=$smem $extra $here/wgmma_harness.cu -o $out/$name > $out/$name.ptxas 2>&1 \
    || { cat $out/$name.ptxas; echo "BUILD FAILED $name"; return 1; }
  grep -A2 "flash_fwd_wgmma" $out/$name.ptxas | grep -E "registers|spill" | sed "s/^/$name: /"
  grep -iE "warning|serializ" $out/$name.ptxas | sed "s/^/$name: /" || true
}
export -f build_one; export out here
printf '%s\n' "$@" | xargs -P ${JOBS:-2} -I{} bash -c 'build_one {}'
