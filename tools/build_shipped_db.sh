#!/usr/bin/env bash
# Rebuilds db/shipped/attntune-shipped.db, the database of tuned results that ships with attntune
# (docs/design/shipped_db.md), on a GPU machine: the plan of tools/shipped_plan.py (the common model
# families' prefill and decode shapes) is queued with `attntune submit` and tuned with `attntune
# serve` on every GPU, as tools/slurm/ does on a cluster; then the compile cache and the service's
# bookkeeping are dropped and the file is vacuumed into place. The campaigns already shipped are
# merged in first: they are kept, and they warm-start the new ones; those whose kernel source has
# changed since they were measured (a template change: export refuses them), and those left
# unfinished whose search space has changed since (tune cannot resume them), are measured again.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: tools/build_shipped_db.sh [options] [-- attntune-submit-args...]

  --out FILE          the database to write (db/shipped/attntune-shipped.db, which is then packed
                      into db/shipped/attntune-shipped.db.tar.xz, the form the repository keeps:
                      commit that; tools/shipped_archive.py)
  --work DIR          where the working database and plan live (a new temporary folder); run the
                      same command with the same --work again to resume after an interruption
  --gpus LIST         passed to `attntune serve --gpus` (all)
  --serve-seconds N   stop serving after N seconds (SIGTERM: each worker records its candidate in
                      flight and puts its campaign back in the queue), then write --out from what
                      is done; the same command again continues where it stopped (the plan is in
                      spread order, so a part-built database covers every family and regime)
  --limit N           only the plan's first N problems (a rehearsal)
  --fresh             do not merge the campaigns of the current --out file in first (merged, a
                      campaign of the plan whose template changed since it was measured is
                      measured again, warm-started from its own best configs; it keeps answering
                      until its new measurement is done)
  --simulate          `attntune serve --simulate` (synthetic results, no GPU): rehearses the
                      pipeline; refused with the default --out, so made-up results never ship
  --simulate-delay-ms N
  --remeasure WHERE   measure again the campaigns of --out that an SQL condition over the campaigns
                      table selects (its columns: b, h, hkv, s, sk, d, dv, dtype, causal, page,
                      varlen, variants, budget_evals, status, ...), as a stale one is: renamed
                      NAME@stale, queued anew under NAME with this build's submit arguments,
                      warm-started from NAME@stale, replaced by the new result once there is one.
                      Deepens a part of the file at a larger budget, and resumes across sessions
                      when the condition excludes what is done (docs/design/shipped_db.md), e.g.
                      "variants = '' AND page = 0 AND varlen = 0 AND s > 1 AND d IN (64, 128)
                      AND COALESCE(budget_evals, 0) < 64" -- --budget-evals 64
  --check             build nothing: export each campaign of --out as this tree renders its
                      template, and list those whose kernel source has changed since they were
                      measured (their `export` is refused until a rebuild); exit 1 if any
  --coverage          build nothing: for each GPU model whose results --out holds, ask `attntune
                      best --problem P --gpu MODEL` of each problem of this tree's plan (the first
                      --limit N), as a user with no database of their own would, and say how many
                      it answers, listing the others; exit 1 if some model misses one
  -h, --help          this text
Arguments after `--` go to `attntune submit` (default: --budget-evals 200, the main job's budget).
Another GPU model's build in the same file names its campaigns apart: `-- --name-suffix @h100 ...`
on an H100 (a campaign stays with the model that started it; docs/design/shipped_db.md, "Several
GPU models in one file").
The binary is $ATTNTUNE_BIN, else build/attntune. Needs python3 (the plan, the final clean-up).
USAGE
}

die() { echo "build_shipped_db.sh: error: $*" >&2; exit 2; }

bin=${ATTNTUNE_BIN:-build/attntune}
default_out=db/shipped/attntune-shipped.db
out=$default_out work="" gpus=all limit="" fresh=0 simulate=0 sim_delay="" check=0 coverage=0 serve_seconds="" remeasure=""
submit_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?}; shift 2 ;;
    --work) work=${2:?}; shift 2 ;;
    --gpus) gpus=${2:?}; shift 2 ;;
    --serve-seconds) serve_seconds=${2:?}; shift 2 ;;
    --limit) limit=${2:?}; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --simulate) simulate=1; shift ;;
    --simulate-delay-ms) sim_delay=${2:?}; shift 2 ;;
    --check) check=1; shift ;;
    --coverage) coverage=1; shift ;;
    --remeasure) remeasure=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; submit_args=("$@"); break ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
done
[ -x "$bin" ] || die "no attntune binary at '$bin' (build it, or set ATTNTUNE_BIN)"
# The campaigns of database $1 with results whose kernel source has changed since they were measured
# (export refuses them: "template has changed"), found by exporting each as this tree renders it:
# "stale NAME" a line, then "total N".
stale_campaigns() {
  local scratch total=0 name
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/attntune-shipped-check-XXXXXX")
  while IFS= read -r name; do
    total=$((total + 1))
    if ! ATTNTUNE_SHIPPED_DB= "$bin" export --db "$1" --campaign "$name" -o "$scratch/k.cu" > /dev/null 2> "$scratch/err"; then
      if grep -q "template has changed" "$scratch/err"; then
        echo "stale $name"
      else
        echo "build_shipped_db.sh: error: export of campaign '$name' failed: $(tail -1 "$scratch/err")" >&2
        rm -rf "$scratch"
        return 2
      fi
    fi
  done < <("$bin" campaigns --db "$1" --format json | python3 -c 'import json, sys; [print(c["name"]) for c in json.load(sys.stdin) if c.get("ok")]')
  rm -rf "$scratch"
  echo "total $total"
}

# The campaigns of database $1 not completed whose search space for some template is not the
# space file of this tree (search_spaces/FAMILY.yaml): one name a line.
unfinished_with_changed_space() {
  local hashes="" family hash
  for family in $(python3 -c 'import sqlite3, sys; [print(r[0]) for r in sqlite3.connect(sys.argv[1]).execute("SELECT DISTINCT s.family FROM campaign_spaces s JOIN campaigns c ON c.id = s.campaign_id WHERE c.status != \x27completed\x27")]' "$1"); do
    [ -e "search_spaces/$family.yaml" ] || continue  # a template this tree no longer has: left as it is
    hash=$("$bin" space --space "search_spaces/$family.yaml" --format json | python3 -c 'import json, sys; print(json.load(sys.stdin)["hash"])') || {
      echo "build_shipped_db.sh: error: cannot load search_spaces/$family.yaml" >&2
      return 2
    }
    hashes+="$family=$hash "
  done
  python3 - "$1" $hashes <<'PY'
import sqlite3, sys
now = dict(arg.split("=", 1) for arg in sys.argv[2:])
con = sqlite3.connect(sys.argv[1])
rows = con.execute("SELECT DISTINCT c.name, s.family, s.space_hash FROM campaigns c JOIN campaign_spaces s "
                   "ON s.campaign_id = c.id WHERE c.status != 'completed'").fetchall()
for name in sorted({name for name, family, h in rows if family in now and now[family] != h}):
    print(name)
PY
}

# The repository keeps the shipped file packed (tools/shipped_archive.py): the default --out is
# unpacked from its archive when missing or older (a checkout without a build, as on a GPU machine),
# and packed into it again once written.
archive=$default_out.tar.xz
is_default_out() { [ "$(realpath -m "$out")" = "$(realpath -m "$default_out")" ]; }
if is_default_out && [ -e "$archive" ] && { [ ! -e "$out" ] || [ "$archive" -nt "$out" ]; }; then
  python3 tools/shipped_archive.py unpack "$archive" "$out"
fi

if [ "$check" = 1 ]; then
  [ -e "$out" ] || die "no database at '$out'"
  report=$(stale_campaigns "$out") || exit 2
  stale=$(grep -c '^stale ' <<< "$report" || true)
  sed -n 's/^stale /stale: /p' <<< "$report" >&2
  echo "$out: $(sed -n 's/^total //p' <<< "$report") campaigns with results, $stale stale" >&2
  [ "$stale" = 0 ] || exit 1
  exit 0
fi
[ -z "$limit" ] || [[ $limit =~ ^[1-9][0-9]*$ ]] || die "--limit must be a positive number (got '$limit')"
# This tree's plan, the first $limit problems of it if set, into file $1.
write_plan() {
  python3 tools/shipped_plan.py --bin "$bin" -o "$1.all"
  if [ -n "$limit" ]; then
    # The header (4 lines) and the first N problems: one problem a line (docs/design/plan.md).
    head -n $((4 + limit)) "$1.all" > "$1"
  else
    cp "$1.all" "$1"
  fi
}

if [ "$coverage" = 1 ]; then
  # What a user is answered on day one: `best --problem` through the user's path (an absent
  # database of their own, the file as the shipped one), once per GPU model the file holds results
  # of, so that it says what an H100 and an H200 user each get from it.
  [ -e "$out" ] || die "no database at '$out'"
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/attntune-shipped-coverage-XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  write_plan "$scratch/plan.yaml"
  sed -n 's/^  - {problem: "\([^"]*\)".*/\1/p' "$scratch/plan.yaml" > "$scratch/problems"
  n=$(wc -l < "$scratch/problems")
  [ "$n" -gt 0 ] || die "the plan has no problems"
  mapfile -t models < <(python3 -c 'import sqlite3, sys; [print(r[0]) for r in sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True).execute("SELECT DISTINCT d.name FROM evaluations e JOIN devices d ON d.id = e.device_id WHERE e.status = \x27ok\x27 ORDER BY d.name")]' "$out")
  [ ${#models[@]} -gt 0 ] || die "'$out' holds no valid result"
  shipped=$(realpath "$out")
  short=0
  for model in "${models[@]}"; do
    answered=0
    while IFS= read -r problem; do
      if ATTNTUNE_SHIPPED_DB=$shipped "$bin" best --db "$scratch/none.db" --problem "$problem" \
           --gpu "$model" --format json > "$scratch/answer" 2> "$scratch/err" &&
         grep -q '"source": "shipped"' "$scratch/answer"; then
        answered=$((answered + 1))
      else
        echo "not answered on $model: $problem ($(tail -1 "$scratch/err"))" >&2
      fi
    done < "$scratch/problems"
    echo "$model: $answered of the plan's $n problems answered" >&2
    [ "$answered" = "$n" ] || short=1
  done
  exit $short
fi
if [ -n "$remeasure" ] && { [ "$fresh" = 1 ] || [ ! -e "$out" ]; }; then
  die "--remeasure takes its campaigns from the --out file ('$out'): it needs that file, and no --fresh"
fi
[ -z "$serve_seconds" ] || [[ $serve_seconds =~ ^[1-9][0-9]*$ ]] ||
  die "--serve-seconds must be a positive number of seconds (got '$serve_seconds')"
if [ "$simulate" = 1 ] && is_default_out; then
  die "--simulate makes synthetic results: give --out another file (they must never ship)"
fi
[ ${#submit_args[@]} -gt 0 ] || submit_args=(--budget-evals 200)
[ -n "$work" ] || work=$(mktemp -d "${TMPDIR:-/tmp}/attntune-shipped-XXXXXX")
mkdir -p "$work"
db="$work/attntune.db"
plan="$work/plan.yaml"
# The service's own runs never consult a shipped database; said explicitly so that a stale one in
# the environment cannot matter.
export ATTNTUNE_SHIPPED_DB=

write_plan "$plan"
echo "plan: $(grep -c '^  - ' "$plan") problems ($plan)" >&2

if [ ! -e "$db" ] && [ "$fresh" = 0 ] && [ -e "$out" ]; then
  # The campaigns --remeasure selects (completed or not; not one already renamed), read from --out
  # before anything is written, so that a bad condition leaves no half-made working database.
  chosen=""
  if [ -n "$remeasure" ]; then
    chosen=$(python3 - "$out" "$remeasure" <<'PY'
import sqlite3, sys
try:
    rows = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True).execute(
        f"SELECT name FROM campaigns WHERE name NOT LIKE '%@stale' AND ({sys.argv[2]}) ORDER BY name").fetchall()
except sqlite3.Error as e:
    sys.exit(f"build_shipped_db.sh: error: --remeasure '{sys.argv[2]}': {e}")
for (name,) in rows:
    print(name)
PY
) || exit 2
    echo "--remeasure selects $(printf '%s' "$chosen" | grep -c . || true) campaigns" >&2
  fi
  "$bin" merge "$out" -o "$db" >&2
  # A campaign measured before its template changed, or left unfinished before its search space
  # changed, is measured again: renamed NAME@stale, so that
  # submit queues its problem anew under NAME and serve warm-starts that from NAME@stale's best
  # configs (the same problem: the nearest). Written out, NAME@stale gives way to NAME once NAME
  # has results, and takes its name back otherwise (a campaign outside the plan, such as the
  # suite's: tools/rerecord_suite.sh; or a time box): nothing answers less than before.
  report=$(stale_campaigns "$db") || exit 2
  stale=$(sed -n 's/^stale //p' <<< "$report")
  # So is a campaign left unfinished (a time box stopped it) whose search space has changed since it
  # was started: `tune` refuses to resume it with another space, so serve would fail it.
  unfinished=$(unfinished_with_changed_space "$db") || exit 2
  stale=$(printf '%s\n%s\n' "$stale" "$unfinished" | sed '/^$/d' | sort -u)
  if [ -n "$stale" ] || [ -n "$chosen" ]; then
    printf '%s\n' "$stale" > "$work/stale.txt"
    printf '%s\n' "$chosen" > "$work/remeasure.txt"
    python3 - "$db" "$work/stale.txt" "$work/remeasure.txt" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
stale = [line for line in open(sys.argv[2]).read().splitlines() if line]
chosen = [line for line in open(sys.argv[3]).read().splitlines() if line and line not in stale]
for name in stale + chosen:
    con.execute("UPDATE campaigns SET name = ? WHERE name = ?", (name + "@stale", name))
con.commit()
if stale:
    print(f"{len(stale)} campaigns measured before their template or space changed: measured again", file=sys.stderr)
if chosen:
    print(f"{len(chosen)} campaigns chosen by --remeasure: measured again", file=sys.stderr)
PY
  fi
fi
"$bin" submit "$plan" --db "$db" "${submit_args[@]}" >&2
serve_args=(--db "$db" --gpus "$gpus")
if [ "$simulate" = 1 ]; then
  serve_args+=(--simulate)
  [ -z "$sim_delay" ] || serve_args+=(--simulate-delay-ms "$sim_delay")
fi
# serve exits 1 when some campaigns failed (no valid config: a recorded result, not a reason to
# throw away the others) and 3 when no GPU could serve; either way what is done is written below
# and the script exits with serve's code.
serve_rc=0
if [ -n "$serve_seconds" ]; then
  "$bin" serve "${serve_args[@]}" >&2 &
  serve_pid=$!
  deadline=$((SECONDS + serve_seconds))
  while kill -0 "$serve_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
  if kill -0 "$serve_pid" 2>/dev/null; then
    echo "build_shipped_db.sh: --serve-seconds $serve_seconds reached: stopping serve (campaigns in flight go back to the queue)" >&2
    kill -TERM "$serve_pid" 2>/dev/null || true
  fi
  wait "$serve_pid" || serve_rc=$?
else
  "$bin" serve "${serve_args[@]}" >&2 || serve_rc=$?
fi
case "$serve_rc" in
  0|1|3) ;;
  *) die "attntune serve exited $serve_rc; the working database stays in $db (the same command resumes)" ;;
esac
"$bin" status --db "$db" >&2 || true
left=$(python3 -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT COUNT(*) FROM queue WHERE state IN (\x27queued\x27, \x27running\x27)").fetchone()[0])' "$db")

# The shipped file holds results only: no compile cache (rebuilt on the user's machine as needed),
# no queue, leases or GPUs of the machine that made it. Written beside --out, then renamed.
tmp="$out.tmp.$$"
rm -f "$tmp"
"$bin" merge "$db" -o "$tmp" >&2
python3 - "$tmp" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("PRAGMA foreign_keys = ON")
# A stale campaign (renamed NAME@stale when merged in) gives way to NAME measured again, or takes
# its name back.
has_results = "SELECT 1 FROM campaigns c WHERE c.name = ? AND EXISTS (SELECT 1 FROM rankings r WHERE r.campaign_id = c.id UNION ALL SELECT 1 FROM evaluations e WHERE e.campaign_id = c.id AND e.status = 'ok')"
replaced = kept = 0
for (stale,) in con.execute("SELECT name FROM campaigns WHERE name LIKE '%@stale'").fetchall():
    name = stale[: -len("@stale")]
    if con.execute(has_results, (name,)).fetchone():
        con.execute("DELETE FROM campaigns WHERE name = ?", (stale,))
        replaced += 1
    else:
        con.execute("DELETE FROM campaigns WHERE name = ?", (name,))
        con.execute("UPDATE campaigns SET name = ? WHERE name = ?", (name, stale))
        kept += 1
if replaced or kept:
    print(f"campaigns renamed NAME@stale (measured before a template or space change, or chosen by --remeasure): "
          f"{replaced} measured again, {kept} kept as they were (outside the plan, or not reached)", file=sys.stderr)
for table in ("builds", "queue", "leases", "gpus"):
    con.execute(f"DELETE FROM {table}")
con.commit()
con.execute("VACUUM")
ok = con.execute("PRAGMA integrity_check").fetchone()[0]
n = con.execute("SELECT COUNT(*) FROM campaigns").fetchone()[0]
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
con.close()
if ok != "ok":
    sys.exit(f"build_shipped_db.sh: the new database fails its integrity check: {ok}")
print(f"{n} campaigns", file=sys.stderr)
PY
mv -f "$tmp" "$out"
rm -f "$tmp-wal" "$tmp-shm"
echo "wrote $out ($(du -h "$out" | cut -f1)); the working database stays in $db" >&2
if is_default_out; then
  python3 tools/shipped_archive.py pack "$out" "$archive"
  echo "commit $archive (the repository's form of $out; the build unpacks it)" >&2
fi
if [ "$left" != 0 ]; then
  echo "build_shipped_db.sh: $left campaigns of the plan not done yet: the same command again continues (with --work $work, or from $out)" >&2
fi
exit "$serve_rc"
