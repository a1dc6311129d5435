#!/usr/bin/env bash
# One GPU call's share of a long job (a tune phase of tools/bars.sh, a shipped-database build): the
# command in a box of --box seconds, its state carried from one lease to the next.
#
#   tools/gpu_box.sh --box SECONDS --work DIR [--state ARCHIVE] [--save ARCHIVE] [--gpu NAME] [--linger SECONDS] -- COMMAND...
#
# A device call runs in a copy of the tree that keeps ignored files only while the machine stays
# warm; a new machine starts bare. So, before COMMAND:
#   --state ARCHIVE  unpacks ARCHIVE (a --save of an earlier call, copied into the tree: carry its
#                    folder) into DIR's parent when DIR does not exist yet;
#   --gpu NAME       refuses (exit 3, nothing run) a machine whose first GPU's name lacks NAME: a
#                    bar names its GPU (issue 43's, an H100) and a call without a kind may get another;
#   the shipped database: a static build carried from the CPU machine looks for it at that machine's
#                    path (ATTNTUNE_SHIPPED_DB_DEFAULT), which the device's copy of the tree lacks; when
#                    $ATTNTUNE_SHIPPED_DB is unset, the tracked archive db/shipped/attntune-shipped.db.tar.xz
#                    is unpacked under .gpu-work/shipped/ ($GPU_BOX_SHIPPED_DIR) and named there (without it `tune` would start
#                    every campaign from nothing, and `best`/`export` would not answer from it).
# Then COMMAND under `timeout -s TERM SECONDS` (attntune's commands stop at SIGTERM with every result
# recorded; re-running resumes them), and a wait of at most --linger seconds (default 120) until no
# process holds a file under DIR open: timeout waits for COMMAND alone, and the tunes a script
# started record their last results after it has gone. Then, whatever COMMAND's exit:
#   --save ARCHIVE   DIR as a .tar.xz (every database in it copied by SQLite's backup, its compile
#                    cache (`builds`) deleted and VACUUMed: a tune phase's databases hold 80+ MB of
#                    cubins, their results a few; resuming compiles again what it needs), for the
#                    call's $OUT, to come back to the CPU machine;
#   each database's campaigns, one line each (name, evaluations, status).
# Exit: COMMAND's (124: the box ended it), 2 for bad arguments, 3 for the wrong GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: tools/gpu_box.sh --box SECONDS --work DIR [--state ARCHIVE] [--save ARCHIVE] [--gpu NAME] [--linger SECONDS] -- COMMAND..."
box="" work="" state="" save="" gpu="" linger=120
while (($#)); do
  case $1 in
    --box) box=${2:?$usage}; shift 2 ;;
    --work) work=${2:?$usage}; shift 2 ;;
    --state) state=${2:?$usage}; shift 2 ;;
    --save) save=${2:?$usage}; shift 2 ;;
    --gpu) gpu=${2:?$usage}; shift 2 ;;
    --linger) linger=${2:?$usage}; shift 2 ;;
    --) shift; break ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $box =~ ^[1-9][0-9]*$ && $linger =~ ^[0-9]+$ && -n $work && $# -gt 0 ]] || { echo "$usage" >&2; exit 2; }
if [[ -n $gpu ]]; then
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ $name == *"$gpu"* ]] || { echo "gpu_box.sh: error: this machine's GPU is '${name:-none}', not $gpu: nothing run" >&2; exit 3; }
  echo "gpu_box.sh: $name"
fi
if [[ -n $state && ! -e $work ]]; then
  [[ -f $state ]] || { echo "gpu_box.sh: error: --state $state: no such file" >&2; exit 2; }
  mkdir -p "$(dirname "$work")"
  tar -C "$(dirname "$work")" -xJf "$state" || { echo "gpu_box.sh: error: could not unpack $state" >&2; exit 2; }
  echo "gpu_box.sh: $work restored from $state"
fi
mkdir -p "$work"
if [[ ! -v ATTNTUNE_SHIPPED_DB ]]; then
  shipped=${GPU_BOX_SHIPPED_DIR:-.gpu-work/shipped}/attntune-shipped.db
  if [[ ! -s $shipped ]]; then
    mkdir -p "$(dirname "$shipped")"
    tar -C "$(dirname "$shipped")" -xJf db/shipped/attntune-shipped.db.tar.xz attntune-shipped.db ||
      { echo "gpu_box.sh: error: could not unpack the shipped database" >&2; exit 3; }
  fi
  [[ $shipped == /* ]] || shipped=$PWD/$shipped
  export ATTNTUNE_SHIPPED_DB=$shipped
fi
t0=$(date +%s)
timeout -s TERM "$box" "$@"
rc=$?
echo "gpu_box.sh: exit $rc after $(($(date +%s) - t0)) s$( ((rc == 124)) && echo ' (the box ended it)')"
# timeout waits for COMMAND alone: what it started (a tune that records its last results at SIGTERM)
# may still write. Wait until no process holds a file under DIR open (at most --linger seconds).
python3 - "$work" "$linger" <<'PY'
import os, sys, time
work, limit = os.path.realpath(sys.argv[1]), float(sys.argv[2])
def holders():
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target == work or target.startswith(work + "/"):
                found.add(int(pid))
                break
    return found
start = time.time()
while (held := holders()) and time.time() - start < limit:
    time.sleep(0.5)
if held:
    print(f"gpu_box.sh: warning: processes {sorted(held)} still hold files under {sys.argv[1]} after {limit:g} s; saving anyway", file=sys.stderr)
elif time.time() - start >= 1:
    print(f"gpu_box.sh: waited {time.time() - start:.0f} s for the command's processes to finish writing")
PY

slim_and_list() {  # mode (slim | list) database [copy]
  python3 - "$@" <<'PY'
import sqlite3, sys
mode, path = sys.argv[1], sys.argv[2]
if mode == "slim":
    src, dst = sqlite3.connect(path), sqlite3.connect(sys.argv[3])
    src.backup(dst)
    src.close()
    dst.execute("DELETE FROM builds")
    dst.commit()
    dst.execute("VACUUM")
    dst.close()
else:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for name, n, status in con.execute(
            "SELECT c.name, (SELECT count(*) FROM evaluations e WHERE e.campaign_id = c.id), c.status "
            "FROM campaigns c ORDER BY c.id"):
        print(f"  {path.rsplit('/', 1)[-1]}: {name} {n} evaluations, {status}")
PY
}
if [[ -n $save ]]; then
  tmp=$(mktemp -d)
  base=$(basename "$work")
  cp -r "$work" "$tmp/$base"
  while IFS= read -r -d '' f; do
    rm -f "$tmp/$base/${f#"$work"/}"-wal "$tmp/$base/${f#"$work"/}"-shm
    slim_and_list slim "$f" "$tmp/$base/${f#"$work"/}" ||
      echo "gpu_box.sh: warning: $f could not be slimmed; saved as it is" >&2
  done < <(find "$work" -name '*.db' -print0)
  mkdir -p "$(dirname "$save")"
  tar -C "$tmp" -cJf "$save" "$base" && echo "gpu_box.sh: saved $save ($(du -h "$save" | cut -f1))"
  rm -rf "$tmp"
fi
while IFS= read -r -d '' f; do slim_and_list list "$f" || true; done < <(find "$work" -name '*.db' -print0 | sort -z)
exit "$rc"
