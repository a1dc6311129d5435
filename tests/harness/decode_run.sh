#!/usr/bin/env bash
# Runs decode_harness binaries from a jobs file, one job a line: BIN | SHAPES | MODES | SECONDS [| CHECKS]
# (decode_harness's arguments; '#' starts a comment). BIN_DIR (default build-decode) holds the
# binaries; the full log goes to LOG (default $OUT/decode.log, else decode.log), and a short table
# (every result line and each binary's verdict) is printed last.
set -o pipefail
jobs=${1:?usage: decode_run.sh JOBS_FILE}
bin=${BIN_DIR:-build-decode}
log=${LOG:-${OUT:-.}/decode.log}
: > "$log"
while IFS='|' read -r b shapes modes secs checks; do
  b=$(echo $b); [ -z "$b" ] || [ "${b:0:1}" = "#" ] && continue
  echo "=== $b | $shapes | $modes | $secs" >> "$log"
  timeout 300 "$bin/$b" "$(echo $shapes)" "$(echo $modes)" $secs $checks >> "$log" 2>&1
  echo "=== $b exit $?" >> "$log"
done < "$jobs"
echo "---- summary"
grep -E "^# |us .*GB/s|FAIL|exit [^0]|error|run_plan" "$log" | sed 's/^=== //'
