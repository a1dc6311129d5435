#!/usr/bin/env bash
# On the GPU machine: every wgmma_harness binary in BIN_DIR over a correctness matrix (odd
# lengths, sk != s both ways, GQA, [B,S,H,D], one-row and empty-causal-row shapes), then the timed
# shapes, the SASS check (HGMMA present, no local memory), then the PyTorch peers in the same call.
# Usage: wgmma_run.sh BIN_DIR PEERS_SCRIPT [TIMED_GLOB]; correctness both grid modes, timing
# PERSIST (harness argument: 0 per-tile grid, 1 persistent, 2 both; default 2). Full log in $OUT/wgmma.log, table last.
set -u
bin=$1; peers=$2; timed=${3:-*}
log=${OUT:-.}/wgmma.log; : > $log
corr="1,2,2,1,1,0,0;2,3,3,200,333,0,0;1,4,2,1000,1000,1,0;2,4,1,517,517,0,0;1,2,2,300,77,0,0;1,2,2,77,300,0,0;1,3,3,2048,2048,0,0;2,16,8,1000,1500,1,0;3,40,40,300,77,0,0"
for x in $bin/*; do
  [ -f $x ] && [ -x $x ] || continue
  n=$(basename $x)
  sass=$(cuobjdump --dump-sass $x 2>/dev/null)
  echo "SASS $n HGMMA=$(grep -c HGMMA <<<"$sass") LDL/STL=$(grep -cE '\b(LDL|STL)\b' <<<"$sass")" | tee -a $log
  timeout 60 $x "$corr" 2 >> $log 2>&1 || echo "CORRECTNESS FAIL or timeout: $n (rc $?)" | tee -a $log
done
for x in $bin/$timed; do
  [ -f $x ] && [ -x $x ] || continue
  n=$(basename $x)
  case $n in
    *64c*) shapes="2,8,8,128,128,0;8,16,16,2048,2048,0" ;;  # the suite's d=64 shapes (tools/tune_suite.sh)
    *64*) shapes="2,8,8,512,512,0;8,16,16,2048,2048,0" ;;
    *) shapes="4,16,16,4096,4096,0;1,16,16,16384,16384,0" ;;
  esac
  timeout 120 $x "$shapes" ${PERSIST:-2} 2>&1 | sed "s/^/$n /" >> $log || echo "TIMED FAIL: $n" | tee -a $log
done
specs="${PEER_SPECS:-4,16,4096,128,0,bf16 1,16,16384,128,0,bf16 4,16,4096,128,1,bf16 1,16,16384,128,1,bf16}"
python3 $peers $specs 2>&1 | grep -v Warn >> $log
echo "==== summary"
grep -c PASS $log | sed 's/^/PASS lines: /'; grep -c FAIL $log | sed 's/^/FAIL lines: /'
grep -E "FAIL|timeout" $log | head -20
grep -E "^SASS" $log
grep -E " TF$" $log | grep -v " 0.0 TF$" | sed -E 's/regs=[^|]*\| //; s/err=.* (PASS|FAIL) \| /\1 /'
grep PEER $log
