#!/usr/bin/env bash
# Runs the harness binaries built by build.sh over the shape suite (tools/tune_suite.sh lists it) and then the
# PyTorch SDPA peers on the same GPU in the same call. Usage: run_suite.sh BIN_DIR PEERS_SCRIPT
set -u
bin=$1; peers=$2
for dt in bf fp; do
  for x in $bin/${dt}128n $bin/${dt}128c; do [ -x $x ] && $x "4,16,16,4096,4096,0;1,16,16,16384,16384,0"; done
  for x in $bin/${dt}64n*; do [ -x $x ] && $x "2,8,8,512,512,0;8,16,16,2048,2048,0"; done
  for x in $bin/${dt}64c*; do [ -x $x ] && $x "2,8,8,128,128,0;8,16,16,2048,2048,0"; done
done
specs=""
for dt in bf16 fp16; do
  specs="$specs 2,8,128,64,1,$dt 2,8,512,64,0,$dt 8,16,2048,64,0,$dt 8,16,2048,64,1,$dt"
  specs="$specs 4,16,4096,128,0,$dt 4,16,4096,128,1,$dt 1,16,16384,128,0,$dt 1,16,16384,128,1,$dt"
done
python3 $peers $specs 2>&1 | grep -v Warn
