#!/usr/bin/env bash
# Builds bwd_harness.cu -DBWD_WGMMA shared libraries for a list of configs: NAME:D:BF16:CAUSAL:WINDOW:BN:BM:ST[:BULK[:DEFER[:LPT[:PROD]]]]
# (flash_bwd_wgmma's tunables: block_n, block_m, q_stages, dq_reduce 0 red / 1 bulk / 2 quad, dq_defer 0/1, longest_first
# 0/4/16, producer 0/1; sm_90a; EXTRA=-DATT_BWD_ABLATE=1..8 (8 with -DATT_BWD_SKEW_CYCLES=N), -DTMA_LOADS=1 with PROD 1). tests/harness/bwd_check.py loads them.
set -e
out=${OUT_DIR:-build-harness}; mkdir -p $out
here=$(dirname "$0")
build_one() {
  IFS=: read name d bf causal window bn bm st bulk defer lpt prod <<<"$1"
  bulk=${bulk:-0}; defer=${defer:-0}; lpt=${lpt:-0}; prod=${prod:-0}
  local dp=$((d <= 64 ? 64 : d <= 128 ? 128 : 256))  # the padded head dim (D_PAD)
  local colsplit=$((dp == 256 ? 2 : 1))  # head dim 256: two warpgroups a half of dK's and dV's head dims
  local wgs=$((bn / 64 * colsplit)) qg=$((bm / 64)); local split=$((wgs / qg > 1 ? wgs / qg : 1))
  local dqn=$((dp / split)) units=$((qg * split / wgs))
  local tma=0; [[ "$EXTRA" == *TMA_LOADS=1* ]] && tma=1  # (EXTRA=-DTMA_LOADS=1: a producer build's TMA loads, one more mbarrier)
  local smem=$((tma * 8 + 2 * bn * dp * 2 + 2 * st * bm * dp * 2 + bn * bm * 2 + (colsplit - 1) * bn * bm * 2 + 2 * st * bm * 4 + (defer || prod ? 1 : 0) * bn * bm * 2 + (bulk == 1 ? wgs * units * 64 * dqn * 4 : 0) + prod * 2 * st * 8 + 1024))
  nvcc -std=c++17 -O3 $EXTRA -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC -Xptxas -v \
    -DATT_HEAD_DIM=$d -DD_PAD=$dp -DATT_DTYPE_BF16=$bf -DATT_CAUSAL=$causal -DATT_WINDOW=$window \
    -DBLOCK_N=$bn -DBLOCK_M=$bm -DQ_STAGES=$st -DDQ_REDUCE_RED=0 -DDQ_REDUCE_BULK=1 -DDQ_REDUCE_QUAD=2 -DDQ_REDUCE=$bulk -DDQ_DEFER=$defer -DLONGEST_FIRST=$lpt -DPRODUCER=$prod -DTHREADS=$(((wgs + prod) * 128)) -DSMEM_BYTES=$smem \
    -DBWD_WGMMA $here/bwd_harness.cu -o $out/lib$name.so 2> $out/$name.ptxas || { cat $out/$name.ptxas; exit 1; }
  echo "$name: $(awk '/Function properties for flash_bwd_wgmma$/{f=1} f&&/spill stores/{printf "%s spilled, ", $5} f&&/Used/{print $5, "registers"; f=0}' $out/$name.ptxas) $(grep -c 'Potential Performance Loss' $out/$name.ptxas) serialisation warnings"
}
export -f build_one; export out here EXTRA
printf '%s\n' "$@" | xargs -P ${JOBS:-2} -I{} bash -c 'build_one {}'
