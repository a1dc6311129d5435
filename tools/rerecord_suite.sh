#!/usr/bin/env bash
# Re-records tests/data/campaigns/h100-suite.db after a flash_fwd_mma template change (its README says
# why: export refuses a result whose kernel no longer renders the same source). Two steps:
#   on the GPU machine:  tools/rerecord_suite.sh measure IN.db OUT.db   (ATTNTUNE_BIN: the binary)
#     each campaign NAME is measured again as NAME-v2 in a copy of IN.db, warm-started from its
#     5 best configs, 5 evaluations, ranked over 3 interleaved rounds of >= 0.3 s;
#   on any machine:      tools/rerecord_suite.sh finish OUT.db
#     the old campaigns are deleted, the new ones take their names, the build cache is dropped.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${ATTNTUNE_BIN:-build/attntune}
case "${1:-}" in
measure)
  in=$2 out=$3
  cp "$in" "$out"
  # name|problem spec, from the campaigns themselves (the store's canonical problem).
  "$A" campaigns --db "$out" --format json | python3 -c '
import json, sys
for c in json.load(sys.stdin):
    p = c["problem"]
    spec = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in p.items())
    print(c["name"] + "|" + spec)' > "$out.list"
  while IFS='|' read -r name spec; do
    "$A" tune --db "$out" --space search_spaces/flash_fwd_mma.yaml --problem "$spec" --campaign "$name-v2" \
      --warm-start 5 --budget-evals 5 --final-top 5 --final-rounds 3 --final-min-seconds 0.3 --format json \
      > /dev/null
    echo "re-measured $name"
  done < "$out.list"
  rm -f "$out.list"
  ;;
finish)
  db=$2
  python3 - "$db" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("PRAGMA foreign_keys = ON")
names = [r[0] for r in con.execute("SELECT name FROM campaigns WHERE name LIKE '%-v2'")]
for new in names:
    old = new[:-3]
    con.execute("DELETE FROM campaigns WHERE name = ?", (old,))
    con.execute("UPDATE campaigns SET name = ? WHERE name = ?", (old, new))
con.execute("DELETE FROM builds")
con.commit()
con.execute("VACUUM")
print(f"{len(names)} campaigns re-recorded")
PY
  ;;
*)
  echo "usage: $0 measure IN.db OUT.db | finish OUT.db" >&2
  exit 2
  ;;
esac
