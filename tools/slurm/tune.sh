#!/usr/bin/env bash
# Tunes a plan over a Slurm cluster: one job-array task per node runs `attntune serve` on its shard
# of the plan, with a database on node-local disk that it copies to OUTDIR/shard-K.db; a merge job
# that starts when every task has ended combines the shards into OUTDIR/attntune.db.
# docs/design/slurm.md says how it works and what happens on time limits and preemption.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/slurm/tune.sh PLAN.yaml OUTDIR [options] [-- attntune-submit-args...]

Splits PLAN (from `attntune plan`) over N array tasks, one node each. Task K queues the plan's
entries i with i % N == K (`attntune submit --shard K/N`) into a database on node-local disk, runs
`attntune serve` until its queue is empty, and copies the database to OUTDIR/shard-K.db. A second
job, started when all tasks have ended (afterany), merges OUTDIR/shard-*.db into OUTDIR/attntune.db
and prints `attntune status` of it. OUTDIR must be on a file system that every node sees.

options:
  --nodes N              array tasks (nodes) to split the plan over (1)
  --partition P          Slurm partition (the cluster's default)
  --time T               time limit of each serve task, as sbatch takes it (30, 4:00:00, 1-12)
  --gpus-per-node G      GPUs per task, asked for as --gres=gpu:G (1); with --simulate: the number
                         of simulated GPUs (2), and no GPU is asked for
  --workers-per-gpu W    serve workers per GPU (1)
  --cpus-per-task C      CPUs per serve task (NVRTC builds run on them)
  --mem M                memory per serve task (sbatch --mem)
  --drain-time S         seconds before the time limit at which serve is told to drain (300)
  --checkpoint S         copy the node-local database to OUTDIR/shard-K.db every S seconds while
                         serving, as well as at the end (600; 0: only at the end)
  --max-parallel M       run at most M array tasks at once (--array=0-(N-1)%M)
  --job-name NAME        prefix of the jobs' names (attntune)
  --sbatch-arg ARG       passed to both sbatch calls as it is (repeat it: --account, --qos, ...)
  --simulate             `attntune serve --simulate`: a simulated GPU, for trying this out
  --simulate-delay-ms N  passed to `attntune serve --simulate-delay-ms`
  --dry-run              print the sbatch commands instead of running them
  -h, --help             this text
Arguments after `--` go to `attntune submit` (e.g. -- --budget-evals 200 --strategy evo).

The attntune binary is $ATTNTUNE_BIN, else build/attntune of this repository; it and OUTDIR must be
reachable under the same paths on every node.
EOF
}

die() { echo "tune.sh: error: $*" >&2; exit 2; }

# Seconds in a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); empty if not one.
time_to_seconds() {
  local t=$1 d=0 h=0 m=0 s=0 rest
  if [[ $t == *-* ]]; then
    d=${t%%-*}; rest=${t#*-}
    IFS=: read -r h m s <<<"$rest"
  else
    local n; n=$(tr -cd ':' <<<"$t" | wc -c)
    case $n in
      0) m=$t ;;
      1) IFS=: read -r m s <<<"$t" ;;
      2) IFS=: read -r h m s <<<"$t" ;;
      *) return 0 ;;
    esac
  fi
  for v in "$d" "${h:-0}" "${m:-0}" "${s:-0}"; do [[ $v =~ ^[0-9]+$ ]] || return 0; done
  echo $(( 10#$d * 86400 + 10#${h:-0} * 3600 + 10#${m:-0} * 60 + 10#${s:-0} ))
}

[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && { usage; exit 0; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
plan=$1 outdir=$2
shift 2

nodes=1 partition="" time_limit="" gpus="" workers_per_gpu=1 cpus="" mem="" drain=300 checkpoint=600
max_parallel="" job_name=attntune simulate=0 sim_delay="" dry_run=0
sbatch_extra=()
need() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case $1 in --?*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; esac  # --opt=value as --opt value
  case $1 in
    --nodes) need "$@"; nodes=$2; shift 2 ;;
    --partition) need "$@"; partition=$2; shift 2 ;;
    --time) need "$@"; time_limit=$2; shift 2 ;;
    --gpus-per-node) need "$@"; gpus=$2; shift 2 ;;
    --workers-per-gpu) need "$@"; workers_per_gpu=$2; shift 2 ;;
    --cpus-per-task) need "$@"; cpus=$2; shift 2 ;;
    --mem) need "$@"; mem=$2; shift 2 ;;
    --drain-time) need "$@"; drain=$2; shift 2 ;;
    --checkpoint) need "$@"; checkpoint=$2; shift 2 ;;
    --max-parallel) need "$@"; max_parallel=$2; shift 2 ;;
    --job-name) need "$@"; job_name=$2; shift 2 ;;
    --sbatch-arg) need "$@"; sbatch_extra+=("$2"); shift 2 ;;
    --simulate) simulate=1; shift ;;
    --simulate-delay-ms) need "$@"; sim_delay=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
submit_args=("$@")

int_ok() { [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] || die "$1 must be an integer >= $3, got '$2'"; }
int_ok --nodes "$nodes" 1
int_ok --workers-per-gpu "$workers_per_gpu" 1
int_ok --drain-time "$drain" 0
int_ok --checkpoint "$checkpoint" 0
[ -z "$gpus" ] || int_ok --gpus-per-node "$gpus" 1
[ -z "$max_parallel" ] || int_ok --max-parallel "$max_parallel" 1
[ -z "$sim_delay" ] || int_ok --simulate-delay-ms "$sim_delay" 0
[ -n "$sim_delay" ] && [ "$simulate" = 0 ] && die "--simulate-delay-ms needs --simulate"
[ -n "$gpus" ] || { if [ "$simulate" = 1 ]; then gpus=2; else gpus=1; fi; }

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/../.." && pwd)
bin=${ATTNTUNE_BIN:-$repo/build/attntune}
[[ $bin == /* ]] || bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
[ -x "$bin" ] || die "no attntune binary at $bin (build it, or set ATTNTUNE_BIN)"
for c in submit serve merge status; do
  "$bin" "$c" --help >/dev/null 2>&1 || die "$bin has no working '$c' command (attntune $c --help fails)"
done
[ -f "$plan" ] || die "$plan: no such plan file"
if [ "$dry_run" = 0 ]; then
  command -v sbatch >/dev/null || die "sbatch not found: run this on a Slurm login node"
fi

# Problems in the plan: entries `- problem: ...` (none found: the format is not the one we know, and
# the shard count is not checked against it).
problems=$(grep -cE '^[[:space:]]*-?[[:space:]]*problem:' "$plan" || true)
if [ "$problems" -gt 0 ] && [ "$nodes" -gt "$problems" ]; then
  echo "tune.sh: the plan has $problems problems: using $problems nodes, not $nodes" >&2
  nodes=$problems
fi

if [ -n "$time_limit" ]; then
  limit_s=$(time_to_seconds "$time_limit")
  [ -n "$limit_s" ] || die "--time '$time_limit' is not a Slurm time limit"
  if [ "$drain" -gt 0 ] && [ "$drain" -ge $((limit_s / 2)) ]; then
    new=$((limit_s / 4))
    echo "tune.sh: --drain-time ${drain}s is over half the time limit (${limit_s}s): using ${new}s" >&2
    drain=$new
  fi
fi

outdir=$(realpath -m "$outdir")
[ "$dry_run" = 1 ] || mkdir -p "$outdir/logs" "$outdir/.tmp"

# One OUTDIR holds one split of one plan: its shard DBs are resumed from (docs/design/slurm.md), and a
# shard DB of another split would hold other shards' campaigns.
manifest="$outdir/tune.conf"
plan_sum=$(sha256sum "$plan" | cut -d' ' -f1)
if [ -f "$manifest" ]; then
  old_nodes=$(sed -n 's/^shards=//p' "$manifest")
  old_sum=$(sed -n 's/^plan_sha256=//p' "$manifest")
  if [ "$old_nodes" != "$nodes" ] || [ "$old_sum" != "$plan_sum" ]; then
    if compgen -G "$outdir/shard-*.db" >/dev/null; then
      die "$outdir already holds shards of another split (shards=$old_nodes, plan sha256 $old_sum); use another OUTDIR"
    fi
  else
    echo "tune.sh: $outdir holds this plan's shards already: the tasks resume from them" >&2
  fi
fi
if [ "$dry_run" = 0 ]; then
  cp "$plan" "$outdir/plan.yaml.tmp" && mv "$outdir/plan.yaml.tmp" "$outdir/plan.yaml"
  printf 'shards=%s\nplan_sha256=%s\nplan_source=%s\nbin=%s\n' "$nodes" "$plan_sum" \
    "$(cd "$(dirname "$plan")" && pwd)/$(basename "$plan")" "$bin" >"$manifest"
fi

array="0-$((nodes - 1))"
[ -z "$max_parallel" ] || array+="%$max_parallel"

serve_cmd=(sbatch --parsable --job-name="$job_name-serve" --array="$array"
           --output="$outdir/logs/serve-%A_%a.out" --open-mode=append)
[ -z "$partition" ] || serve_cmd+=(--partition="$partition")
[ -z "$time_limit" ] || serve_cmd+=(--time="$time_limit")
[ -z "$cpus" ] || serve_cmd+=(--cpus-per-task="$cpus")
[ -z "$mem" ] || serve_cmd+=(--mem="$mem")
[ "$drain" = 0 ] || serve_cmd+=(--signal="B:TERM@$drain")
[ "$simulate" = 1 ] || serve_cmd+=(--gres="gpu:$gpus")
serve_cmd+=(${sbatch_extra[@]+"${sbatch_extra[@]}"} "$script_dir/serve.sbatch"
            --bin "$bin" --out "$outdir" --shards "$nodes" --checkpoint "$checkpoint"
            --workers-per-gpu "$workers_per_gpu")
if [ "$simulate" = 1 ]; then
  serve_cmd+=(--simulate --simulate-gpus "$gpus")
  [ -z "$sim_delay" ] || serve_cmd+=(--simulate-delay-ms "$sim_delay")
fi
serve_cmd+=(-- ${submit_args[@]+"${submit_args[@]}"})

merge_cmd=(sbatch --parsable --job-name="$job_name-merge" --output="$outdir/logs/merge-%j.out"
           --open-mode=append --time=30)
[ -z "$partition" ] || merge_cmd+=(--partition="$partition")
merge_tail=(${sbatch_extra[@]+"${sbatch_extra[@]}"} "$script_dir/merge.sbatch" --bin "$bin" --out "$outdir" --shards "$nodes")

if [ "$dry_run" = 1 ]; then
  printf '%q ' "${serve_cmd[@]}"; echo
  printf '%q ' "${merge_cmd[@]}" "--dependency=afterany:<serve job>" "${merge_tail[@]}"; echo
  exit 0
fi

serve_job=$("${serve_cmd[@]}") || die "sbatch of the serve array failed"
serve_job=${serve_job%%;*}
merge_job=$("${merge_cmd[@]}" --dependency="afterany:$serve_job" "${merge_tail[@]}") || {
  echo "tune.sh: error: sbatch of the merge job failed; the serve array $serve_job runs anyway:" \
       "merge by hand with: sbatch --dependency=afterany:$serve_job ${merge_tail[*]}" >&2
  exit 1
}
merge_job=${merge_job%%;*}
printf 'serve_job=%s\nmerge_job=%s\n' "$serve_job" "$merge_job" >"$outdir/jobs.env"

if [ "$simulate" = 1 ]; then gpu_text="$gpus simulated GPUs"; else gpu_text="$gpus GPUs"; fi
cat <<EOF
attntune on Slurm: plan $plan${problems:+ ($problems problems)} over $nodes tasks, $gpu_text each
  serve array job $serve_job (tasks $array), logs $outdir/logs/serve-${serve_job}_K.out
  merge job       $merge_job (after every task ends), log $outdir/logs/merge-$merge_job.out
  results         $outdir/shard-K.db per task, merged into $outdir/attntune.db
watch:    squeue -j $serve_job,$merge_job        tail -f $outdir/logs/serve-${serve_job}_0.out
stop early, keeping the results (serve drains, the shards are copied, the merge runs):
          scancel --batch --signal=TERM $serve_job
resume:   the same command again (each task resumes from its OUTDIR/shard-K.db)
EOF
