#!/usr/bin/env bash
# Builds decode_harness binaries (sm_90) for a list of flash_decode configs, keeps ptxas's report of
# each, and compiles the kernel alone for sm_80 and sm_89 (ARCHS, default "80 89"; empty skips) to
# prove it builds there. A config:
#   NAME:D:BF16:CAUSAL:BM:BN:WARPS:WARPS_M:SHARE:STAGES:CTAS:QREGS:COMBINE[:KV]
#   SHARE cta|warp, COMBINE kernel|last_cta|cluster2|cluster4|cluster8|cluster16 (clusterN: sm_90 only,
#   so the sm_80/sm_89 compiles are skipped), BM the derived block_m (16, 32 or 64: the packed rows
#   (h / hkv) * s rounded up), QREGS 0|1 (the space derives it: warp_m_tiles * d <= 128), KV
#   cp_async (default) | tma (kv_load; sm_90 only, so the sm_80/sm_89 compiles are skipped).
# The -D flags are the renderer's: ATT_*, every param, enum constants, threads and smem_bytes (the
# formulas of search_spaces/flash_decode.yaml). OUT_DIR (default build-decode) receives NAME,
# NAME.ptxas and NAME.smXX.cubin. JOBS (default 2) builds in parallel.
set -e
out=${OUT_DIR:-build-decode}; mkdir -p $out
here=$(cd "$(dirname "$0")" && pwd)
build_one() {
  IFS=: read name d bf causal bm bn w wm share st ctas qr comb kv <<<"$1"
  local kv_i=0 archs=${ARCHS-80 89}; [ "$kv" = tma ] && { kv_i=1; archs=; }
  local share_i=0; [ "$share" = warp ] && share_i=1
  local comb_i=0 cluster=1; [ "$comb" = last_cta ] && comb_i=1
  case $comb in cluster2) comb_i=2;; cluster4) comb_i=3;; cluster8) comb_i=4;; cluster16) comb_i=5;; esac
  case $comb in cluster*) cluster=${comb#cluster}; archs=;; esac
  local threads=$((w * 32 + kv_i * 32)) wn=$((w / wm))
  local ring=$((st * bn * d * 4)) qb=$((bm * d * 2))
  local merge=$((bm * (d + 4) * 4 + (wn + 3) * bm * 4))
  local smem=$((qb + ring)); [ $merge -gt $smem ] && smem=$merge
  local defs="-DATT_HEAD_DIM=$d -DATT_DTYPE_BF16=$bf -DATT_CAUSAL=$causal -DBLOCK_M=$bm -DBLOCK_N=$bn -DWARPS=$w \
    -DWARPS_M=$wm -DTILE_SHARE_CTA=0 -DTILE_SHARE_WARP=1 -DTILE_SHARE=$share_i -DSTAGES=$st -DCTAS_PER_SM=$ctas \
    -DQ_IN_REGS=$qr -DCOMBINE_KERNEL=0 -DCOMBINE_LAST_CTA=1 -DCOMBINE_CLUSTER2=2 -DCOMBINE_CLUSTER4=3 \
    -DCOMBINE_CLUSTER8=4 -DCOMBINE_CLUSTER16=5 -DCOMBINE=$comb_i -DCLUSTER=$cluster \
    -DKV_LOAD_CP_ASYNC=0 -DKV_LOAD_TMA=1 -DKV_LOAD=$kv_i -DTHREADS=$threads -DSMEM_BYTES=$smem ${EXTRA_DEFS:-}"
  nvcc -std=c++17 -O3 -arch=sm_90 -Xptxas -v $defs -DCONFIG_NAME="\"$name\"" $here/decode_harness.cu \
    -o $out/$name > $out/$name.ptxas 2>&1 || { cat $out/$name.ptxas; echo "BUILD FAILED $name"; return 1; }
  for a in $archs; do
    nvcc -std=c++17 -O3 -cubin -arch=sm_$a -Xptxas -v $defs $here/../../templates/flash_decode/kernel.cu \
      -o $out/$name.sm$a.cubin > $out/$name.sm$a.ptxas 2>&1 || { cat $out/$name.sm$a.ptxas; echo "BUILD FAILED $name sm_$a"; return 1; }
  done
  # One line per entry point: registers, spills (sm_90; the other archs' spills too).
  for f in $out/$name.ptxas $(for a in $archs; do echo $out/$name.sm$a.ptxas; done); do
    awk -v n="$name" -v f="$(basename $f .ptxas)" '/Compiling entry function/ {e=$0; sub(/.*function ./,"",e); sub(/. for.*/,"",e)}
      /spill stores/ {sp=$0} /Used [0-9]+ registers/ && e ~ /flash_decode/ {r=$0; sub(/.*Used /,"",r); sub(/ registers.*/,"",r);
      s=sp; sub(/^ *ptxas info *: */,"",s); printf "%s %s %s: %s regs, %s\n", n, f, e, r, s}' $f
  done
}
export -f build_one; export out here
printf '%s\n' "$@" | xargs -P ${JOBS:-2} -I{} bash -c 'build_one {}'
