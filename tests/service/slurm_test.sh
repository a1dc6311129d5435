#!/usr/bin/env bash
# tools/slurm/ against a real Slurm: brings up munged, slurmctld and three slurmd (node1..node3, all
# on this host) in a temporary directory, tunes a plan with tools/slurm/tune.sh --simulate, and
# checks the merged database:
#   1. a full run: every planned problem is a done campaign of the merged database exactly once, in
#      the shard --shard K/N put it in; the merged evaluations are the sum over the shards (none
#      lost, none counted twice); merging the shards again changes nothing.
#   2. drain and resume: `scancel --batch --signal=TERM` while the campaigns run; every task drains
#      and exits 0, no campaign is left running; the same tune.sh again resumes from the shards and
#      finishes everything without losing an evaluation.
# docs/design/slurm.md says how and why Slurm is brought up this way.
#
# usage: tests/service/slurm_test.sh [ATTNTUNE_BIN]     (default $ATTNTUNE_BIN, else build/attntune)
# Needs root, munge and Slurm (slurmctld, slurmd, slurm-client: tools/setup.sh installs them); exits
# 77 (skipped) without them. ATTNTUNE_SLURM_TEST_KEEP=1 keeps the temporary directory (logs,
# databases). Every daemon and job process it started is stopped on exit, also when it is killed:
# a watchdog outside its process group sweeps up after it.
set -euo pipefail
shopt -s inherit_errexit
export PATH="$PATH:/usr/sbin:/sbin"

# --- The watchdog: `slurm_test.sh --sweep DIR PID` waits for PID to end, then ends every process
# whose environment names DIR's slurm.conf (the daemons, their slurmstepd, the jobs) and removes DIR.
sweep() {
  local dir=$1 keep=${2:-0} p
  local mark="SLURM_CONF=$dir/slurm.conf"
  local victims=()
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" != "$$" ] && [ "$p" != "$BASHPID" ] || continue
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qxF "$mark"; then victims+=("$p"); fi
  done
  if [ ${#victims[@]} -gt 0 ]; then
    kill -TERM "${victims[@]}" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      local alive=()
      for p in "${victims[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
      [ ${#alive[@]} -gt 0 ] || break
      victims=("${alive[@]}")
      sleep 0.5
    done
    kill -KILL "${victims[@]}" 2>/dev/null || true
  fi
  [ "$keep" = 1 ] || rm -rf "$dir"
}
if [ "${1:-}" = --sweep ]; then
  while kill -0 "$3" 2>/dev/null; do sleep 1; done
  [ -d "$2" ] && sweep "$2" "${ATTNTUNE_SLURM_TEST_KEEP:-0}"
  exit 0
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"
bin=${1:-${ATTNTUNE_BIN:-$repo/build/attntune}}
keep=${ATTNTUNE_SLURM_TEST_KEEP:-0}
start=$SECONDS
deadline=$((SECONDS + ${ATTNTUNE_SLURM_TEST_DEADLINE:-220}))  # under the ctest TIMEOUT

say() { echo "slurm_test [$((SECONDS - start))s]: $*"; }
skip() { echo "slurm_test: SKIPPED: $*"; exit 77; }

# --- What it needs.
[ "$(id -u)" = 0 ] || skip "needs root (it runs munged, slurmctld and slurmd itself, SlurmUser=root)"
for c in munged munge slurmctld slurmd sbatch scontrol sinfo squeue scancel; do
  command -v "$c" >/dev/null || skip "'$c' is not installed (Debian: munge slurmctld slurmd slurm-client; tools/setup.sh installs them)"
done
for c in jq sqlite3; do
  command -v "$c" >/dev/null || { echo "slurm_test: FAILED: '$c' is missing (tools/setup.sh installs it)" >&2; exit 1; }
done
[[ $bin == /* ]] || bin="$PWD/$bin"
[ -x "$bin" ] || { echo "slurm_test: FAILED: no attntune binary at $bin (build it, or pass its path)" >&2; exit 1; }
for c in submit serve status merge campaigns; do
  "$bin" "$c" --help >/dev/null 2>&1 \
    || { echo "slurm_test: FAILED: $bin has no working '$c' command (attntune $c --help fails)" >&2; exit 1; }
done

T=$(mktemp -d /tmp/attntune-slurm-test.XXXXXX)
chmod 755 "$T"  # munged wants its socket's directory searchable by all
setsid "$self" --sweep "$T" "$$" </dev/null >/dev/null 2>&1 &
export ATTNTUNE_BIN="$bin"  # tools/slurm/tune.sh's binary
export SLURM_CONF="$T/slurm.conf"  # from here on, every process started carries it (the sweep's mark)

dump_logs() {
  local f
  for f in "$T"/log/*.log "$T"/log/*.out "$T"/out*/logs/*.out; do
    [ -f "$f" ] || continue
    echo "----- $f (last 40 lines)"
    tail -n 40 "$f"
  done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then dump_logs >&2; fi
  # Jobs first, while slurmctld and slurmd are there to end them; then everything of ours.
  if [ -f "$T/slurm.conf" ]; then
    local jobs; jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u || true)
    # shellcheck disable=SC2086
    [ -z "$jobs" ] || scancel --quiet $jobs 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null || true)" ] && break
      sleep 0.5
    done
  fi
  sweep "$T" "$keep"
  [ "$keep" = 1 ] && echo "slurm_test: kept $T" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "slurm_test: FAILED: $*" >&2; exit 1; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...: polls COMMAND until it succeeds
  local limit=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$limit" ] && [ "$SECONDS" -lt "$deadline" ] || fail "timed out waiting for $what"
    sleep 0.3
  done
}

# --- Ports: five free ones in a row (slurmctld, the default slurmd port, node1..3).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=""
for _ in $(seq 1 50); do
  b=$((20000 + RANDOM % 30000))
  ok=1
  for p in $(seq "$b" $((b + 4))); do port_free "$p" || { ok=0; break; }; done
  [ "$ok" = 1 ] && { base=$b; break; }
done
[ -n "$base" ] || fail "found no 5 free TCP ports on 127.0.0.1"

# --- munge: its own key, socket, pid, log and seed files under $T/munge.
mkdir -p "$T/munge" "$T/log" "$T/state" "$T/nodes"
chmod 755 "$T/munge"
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$T/munge/munge.key"
else
  dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 600 "$T/munge/munge.key"
sock="$T/munge/munge.socket"
munged --foreground --key-file="$T/munge/munge.key" --socket="$sock" --pid-file="$T/munge/munged.pid" \
  --log-file="$T/log/munged.log" --seed-file="$T/munge/munged.seed" >"$T/log/munged.out" 2>&1 &
wait_for 10 "munged ($T/log/munged.out)" sh -c "munge -n -S '$sock' | unmunge -S '$sock'"
say "munged up (socket $sock)"

# --- Slurm: one controller, three nodes on this host (NodeHostname=localhost, a port each, each
# slurmd started with -N NAME). Each node's "local disk" is $T/nodes/NAME: a TaskProlog gives the
# job SLURM_TMPDIR there, as sites with node-local scratch do.
cat >"$T/task_prolog.sh" <<EOF
#!/bin/sh
d="$T/nodes/\$SLURMD_NODENAME/tmp/job\$SLURM_JOB_ID"
mkdir -p "\$d" && echo "export SLURM_TMPDIR=\$d"
EOF
chmod 755 "$T/task_prolog.sh"
nodes=(node1 node2 node3)
cat >"$T/slurm.conf" <<EOF
# attntune tests/service/slurm_test.sh: a throwaway cluster on one host.
ClusterName=attntune-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/nodes/%n/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/nodes/%n/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
TaskProlog=$T/task_prolog.sh
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=20
InactiveLimit=0
KillWait=10
MinJobAge=3600
SchedulerParameters=sched_min_interval=0
EOF
for i in "${!nodes[@]}"; do
  n=${nodes[$i]}
  mkdir -p "$T/nodes/$n/spool" "$T/nodes/$n/tmp"
  echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 2 + i)) CPUs=1 RealMemory=1000 State=UNKNOWN" >>"$T/slurm.conf"
done
echo "PartitionName=test Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP" >>"$T/slurm.conf"

(cd "$T" && exec slurmctld -D -i -f "$T/slurm.conf") >"$T/log/slurmctld.out" 2>&1 &
ctld_up() {
  # Three nodes on one host need a Slurm built with --enable-multiple-slurmd (Debian's is).
  if grep -qs 'Duplicated NodeHostName' "$T/log/slurmctld.out" "$T/log/slurmctld.log"; then
    skip "this Slurm is built without --enable-multiple-slurmd: it cannot run three slurmd on one host"
  fi
  scontrol ping 2>/dev/null | grep -q UP
}
until ctld_up; do
  [ "$SECONDS" -lt $((start + 30)) ] || fail "timed out waiting for slurmctld ($T/log/slurmctld.log)"
  sleep 0.3
done
multi=$(scontrol show config | sed -n 's/^MULTIPLE_SLURMD *= *//p')
[ "$multi" = Yes ] || skip "this Slurm is built without --enable-multiple-slurmd (MULTIPLE_SLURMD='$multi')"
for n in "${nodes[@]}"; do
  (cd "$T" && exec slurmd -D -N "$n" -f "$T/slurm.conf") >"$T/log/slurmd-$n.out" 2>&1 &
done
all_idle() { [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" = "${#nodes[@]}" ]; }
wait_for 30 "${#nodes[@]} idle nodes (the slurmd logs below)" all_idle
say "Slurm up: slurmctld on 127.0.0.1:$base, slurmd ${nodes[*]} on ports $((base + 2))-$((base + 4))"

# --- The plan: 7 problems, so that 3 shards get 3, 2 and 2.
problems=(
  "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=0"
  "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1"
  "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=fp16,causal=0"
  "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=fp16,causal=1"
  "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=0"
  "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=1"
  "b=1,h=16,hkv=16,s=16384,sk=16384,d=128,dtype=bf16,causal=0"
)
P=${#problems[@]}
N=${#nodes[@]}
{
  echo "model: slurm-test"
  echo "source: tests/service/slurm_test.sh"
  echo "problems:"
  for p in "${problems[@]}"; do printf '  - problem: "%s"\n    regime: prefill\n' "$p"; done
} >"$T/plan.yaml"

# --- Helpers on jobs and databases.
job_records() { scontrol -o show job "$1" 2>/dev/null; }
job_finished() {  # every record of job $1 in a final state
  local recs; recs=$(job_records "$1") || return 1
  [ -n "$recs" ] || return 1
  ! grep -qE 'JobState=(PENDING|RUNNING|CONFIGURING|COMPLETING|SUSPENDED|REQUEUED|RESIZING|SIGNALING|STAGE_OUT)' <<<"$recs"
}
expect_completed() {  # expect_completed JOB WHAT: every record COMPLETED with exit 0:0
  local recs; recs=$(job_records "$1")
  local bad; bad=$(grep -vE 'JobState=COMPLETED .*ExitCode=0:0' <<<"$recs" \
                   | grep -oE '\<(JobId|ArrayTaskId|JobState|ExitCode)=[^ ]*' | tr '\n' ' ' || true)
  [ -z "$bad" ] || fail "$2 (job $1) did not complete with exit 0: $bad"
}
# campaigns DB > JSON lines {name, problem (canonical spec), status, evaluations}
campaigns_of() {
  "$bin" campaigns --db "$1" --format json | jq -c '.[] | {name, status, evaluations, problem:
    (if (.problem | type) == "string" then .problem else
      "b=\(.problem.b),h=\(.problem.h),hkv=\(.problem.hkv),s=\(.problem.s),sk=\(.problem.sk),d=\(.problem.d),dtype=\(.problem.dtype),causal=\(if .problem.causal == true then 1 elif .problem.causal == false then 0 else .problem.causal end)\(if .problem.page then ",page=\(.problem.page)" else "" end)"
    end)}'
}
# The queue of a database, one JSON line per queued campaign: {name, state, problem} (a campaign
# that has not started has a queue row but no campaign row yet).
queue_of() {
  "$bin" status --db "$1" --format json | jq -c '.campaigns[] | {name: .campaign, state, problem:
    "b=\(.problem.b),h=\(.problem.h),hkv=\(.problem.hkv),s=\(.problem.s),sk=\(.problem.sk),d=\(.problem.d),dtype=\(.problem.dtype),causal=\(if .problem.causal == true then 1 elif .problem.causal == false then 0 else .problem.causal end)\(if .problem.page then ",page=\(.problem.page)" else "" end)"}'
}
# A fingerprint of a database: its campaigns (sorted) and the row count of every table.
fingerprint() {
  campaigns_of "$1" | sort
  sqlite3 "$1" "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name" | while read -r t; do
    echo "$t $(sqlite3 "$1" "SELECT count(*) FROM \"$t\"")"
  done
}
run_tune() {  # run_tune OUTDIR [tune.sh options...]: submits, then waits for the merge job
  local out=$1
  shift
  "$repo/tools/slurm/tune.sh" "$T/plan.yaml" "$out" --nodes "$N" --simulate --time 10 --drain-time 60 "$@" >"$out.tune.txt" \
    || { cat "$out.tune.txt" >&2; fail "tools/slurm/tune.sh failed"; }
  # shellcheck disable=SC1091
  . "$out/jobs.env"
  [ -n "${serve_job:-}" ] && [ -n "${merge_job:-}" ] || fail "tune.sh wrote no job ids to $out/jobs.env"
}

# check_merged OUTDIR EXPECT: the shards and the merged database of a run that has ended.
# EXPECT=done: every planned problem done; EXPECT=drained: none running, some still queued.
check_merged() {
  local out=$1 expect=$2 k i
  for ((k = 0; k < N; k++)); do
    [ -f "$out/shard-$k.db" ] || fail "no $out/shard-$k.db"
    campaigns_of "$out/shard-$k.db" >"$out/shard-$k.jsonl"
  done
  [ -f "$out/attntune.db" ] || fail "no merged $out/attntune.db"
  campaigns_of "$out/attntune.db" >"$out/merged.jsonl"
  "$bin" status --db "$out/attntune.db" --format json >"$out/status-check.json"

  for ((k = 0; k < N; k++)); do queue_of "$out/shard-$k.db" >"$out/queue-$k.jsonl"; done
  queue_of "$out/attntune.db" >"$out/queue-merged.jsonl"
  # Each planned problem: queued once in the merged DB, in shard i % N and in no other shard; and
  # at most one campaign of it anywhere (exactly one once done).
  for i in "${!problems[@]}"; do
    local p=${problems[$i]} want=$((i % N))
    local n; n=$(jq -r --arg p "$p" 'select(.problem == $p) | .name' "$out/queue-merged.jsonl" | wc -l)
    [ "$n" = 1 ] || fail "problem $p: queued $n times in the merged database, want 1"
    n=$(jq -r --arg p "$p" 'select(.problem == $p) | .name' "$out/merged.jsonl" | wc -l)
    if [ "$expect" = done ]; then
      [ "$n" = 1 ] || fail "problem $p: $n campaigns in the merged database, want 1"
    else
      [ "$n" -le 1 ] || fail "problem $p: $n campaigns in the merged database, want at most 1"
    fi
    for ((k = 0; k < N; k++)); do
      n=$(jq -r --arg p "$p" 'select(.problem == $p) | .name' "$out/queue-$k.jsonl" | wc -l)
      if [ "$k" = "$want" ]; then
        [ "$n" = 1 ] || fail "problem $i ($p): queued $n times in shard $k, want 1 (--shard $k/$N)"
      else
        [ "$n" = 0 ] || fail "problem $i ($p) is in shard $k, want only shard $want"
      fi
    done
  done
  local queued; queued=$(wc -l <"$out/queue-merged.jsonl")
  [ "$queued" = "$P" ] || fail "$queued campaigns queued in the merged database, want $P (one per planned problem)"
  local total; total=$(wc -l <"$out/merged.jsonl")
  if [ "$expect" = done ]; then
    [ "$total" = "$P" ] || fail "$total campaigns in the merged database, want $P (one per planned problem)"
  fi

  # Evaluations: the merged database holds each shard's, campaign by campaign: none lost, none twice.
  cat "$out"/shard-*.jsonl >"$out/shards.jsonl"
  local diff
  diff=$(jq -rs 'group_by(.name)[] | select(length > 1) | .[0].name' "$out/shards.jsonl")
  [ -z "$diff" ] || fail "campaigns in more than one shard: $diff"
  diff=$(jq -rn --slurpfile s "$out/shards.jsonl" --slurpfile m "$out/merged.jsonl" '
    ($s | map({(.name): .evaluations}) | add) as $se | ($m | map({(.name): .evaluations}) | add) as $me
    | ($se + $me | keys[]) as $k | select($se[$k] != $me[$k]) | "\($k): shards \($se[$k]) merged \($me[$k])"')
  [ -z "$diff" ] || fail "merged evaluations differ from the shards': $diff"
  local sum_s sum_m
  sum_s=$(jq -s 'map(.evaluations) | add' "$out/shards.jsonl")
  sum_m=$(jq -s 'map(.evaluations) | add' "$out/merged.jsonl")
  [ "$sum_s" = "$sum_m" ] || fail "evaluations: $sum_m merged, $sum_s over the shards"

  # The queue, as `attntune status --format json` tells it.
  local counts; counts=$(jq -c '.counts' "$out/status-check.json")
  local running; running=$(jq '.counts.running' "$out/status-check.json")
  [ "$running" = 0 ] || fail "campaigns left running after the jobs ended: $counts"
  local nstat; nstat=$(jq '.campaigns | length' "$out/status-check.json")
  [ "$nstat" = "$P" ] || fail "status lists $nstat campaigns, want $P"
  if [ "$expect" = "done" ]; then
    [ "$(jq '.counts.done' "$out/status-check.json")" = "$P" ] || fail "not every campaign is done: $counts"
    local bad; bad=$(jq -r '.campaigns[] | select(.state != "done" or .evaluations < 1) | "\(.campaign) \(.state) \(.evaluations)"' "$out/status-check.json")
    [ -z "$bad" ] || fail "campaigns not done, or done with no evaluation: $bad"
  else
    [ "$(jq '.counts.failed' "$out/status-check.json")" = 0 ] || fail "failed campaigns: $counts"
    [ "$(jq '.counts.queued' "$out/status-check.json")" -ge 1 ] \
      || fail "no campaign left queued after the drain: $counts (the signal came too late to test draining)"
  fi

  # Merging the shards again into the merged database changes nothing.
  fingerprint "$out/attntune.db" >"$out/fp-before.txt"
  "$bin" merge "$out"/shard-*.db -o "$out/attntune.db" >/dev/null || fail "merging again failed"
  fingerprint "$out/attntune.db" >"$out/fp-after.txt"
  diff -u "$out/fp-before.txt" "$out/fp-after.txt" >&2 || fail "merging the shards again changed $out/attntune.db"

  # The node-local databases are gone (each task removes its own after copying it out).
  local left; left=$(find "$T/nodes" -name 'attntune*.db' 2>/dev/null | head -3)
  [ -z "$left" ] || fail "node-local databases left behind: $left"
  echo "$counts, $sum_m evaluations over $P campaigns"
}

# --- 1. A full run.
budget=${ATTNTUNE_SLURM_TEST_BUDGET:-8}
t0=$SECONDS
run_tune "$T/out1" --simulate-delay-ms 5 --checkpoint 1 -- --budget-evals "$budget" --seed 7
say "run 1: serve array job $serve_job over $N nodes, merge job $merge_job"
wait_for $((deadline - SECONDS)) "merge job $merge_job of run 1" job_finished "$merge_job"
expect_completed "$serve_job" "a serve task of run 1"
expect_completed "$merge_job" "the merge job of run 1"
result=$(check_merged "$T/out1" "done")
say "run 1 ended in $((SECONDS - t0))s: $result"

# --- 2. Drain on SIGTERM, then resume.
t0=$SECONDS
run_tune "$T/out2" --simulate-delay-ms 200 --checkpoint 1 -- --budget-evals 40 --seed 7
say "run 2: serve array job $serve_job, merge job $merge_job; SIGTERM once every task serves"
serving() {
  local k
  for ((k = 0; k < N; k++)); do
    grep -qs 'attntune serve --gpus' "$T/out2/logs/serve-${serve_job}_$k.out" || return 1
  done
}
wait_for 60 "every task of job $serve_job to start serving" serving
sleep 2
scancel --batch --signal=TERM "$serve_job"
wait_for $((deadline - SECONDS)) "merge job $merge_job of run 2" job_finished "$merge_job"
expect_completed "$serve_job" "a serve task drained by SIGTERM"
expect_completed "$merge_job" "the merge job of run 2"
for ((k = 0; k < N; k++)); do
  grep -qs 'after draining' "$T/out2/logs/serve-${serve_job}_$k.out" || fail "task $k does not say it drained"
done
result=$(check_merged "$T/out2" drained)
say "run 2 drained in $((SECONDS - t0))s: $result"
cp "$T/out2/merged.jsonl" "$T/out2/drained.jsonl"

t0=$SECONDS
run_tune "$T/out2" --simulate-delay-ms 5 --checkpoint 1 -- --budget-evals 40 --seed 7
say "run 2, resumed: serve array job $serve_job, merge job $merge_job"
wait_for $((deadline - SECONDS)) "merge job $merge_job of the resumed run" job_finished "$merge_job"
expect_completed "$serve_job" "a resumed serve task"
expect_completed "$merge_job" "the merge job of the resumed run"
for ((k = 0; k < N; k++)); do
  grep -qs "resuming from $T/out2/shard-$k.db" "$T/out2/logs/serve-${serve_job}_$k.out" \
    || fail "task $k did not resume from its shard"
done
result=$(check_merged "$T/out2" "done")
lost=$(jq -rn --slurpfile a "$T/out2/drained.jsonl" --slurpfile b "$T/out2/merged.jsonl" '
  ($b | map({(.name): .evaluations}) | add) as $after
  | $a[] | select(.evaluations > ($after[.name] // 0)) | "\(.name): \(.evaluations) before, \($after[.name]) after"')
[ -z "$lost" ] || fail "the resumed run lost evaluations: $lost"
say "run 2 resumed in $((SECONDS - t0))s: $result"

say "passed in $((SECONDS - start))s"
