#!/usr/bin/env bash
# Issue 44's MLA prefill bar in one GPU call (docs/design/head_dims.md "Value head dims"): the
# DeepSeek-V3-like prefill (b=1, 128 heads, d=192 for q and k, dv=128 for v, s=8192, causal, bf16)
# tuned on flash_fwd_wgmma (warm-started from the shipped database), exported, and timed in one
# process beside FlashAttention-4's sm90 kernel for the same shape and SDPA's cuDNN (and flash, which
# refuses dv != d) by the FA4 kit's compare.py with tools/fa4_headdim_v.patch applied; every output is
# checked against a float32 reference before any timing. A short table and the bar's two numbers
# (>= 1.0x FA4, >= 550 TFLOP/s) come last.
#
# CPU machine, first: the kit patched and FA4's kernels for the problem built (docs/EXPORT.md):
#   mkdir -p .fa4 && cp -r ../shared/peers/fa4/. .fa4/ && chmod -R u+w .fa4
#   patch -d .fa4 -p1 < tools/fa4_headdim_v.patch
#   ~/.cache/fa4kit/venv/bin/python .fa4/build_aot.py --out .fa4/aot --suite none \
#       --problem b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1
#   tools/mla_prefill_bar.sh OUT_DIR --dry-run
# --dry-run needs no GPU: the tune command with its flags (it stops at "no NVIDIA driver", exit 3;
# a bad flag or problem is exit 2), an export of the problem from the shipped database in the place
# of the tuned one, and compare.py's plan (the FA4 kernel, its call check, ours' head_dim_v call).
# GPU machine (carry .fa4 and the binary's folder; about 2.5 minutes on an H200):
#   ATTNTUNE_BIN=.gpubin/attntune tools/mla_prefill_bar.sh "$OUT"
# Environment: ATTNTUNE_BIN (default .gpubin/attntune where it exists, else build/attntune),
# ATTNTUNE_SOURCE_DIR (default the current directory), FA4_KIT (.fa4), FA4_AOT ($FA4_KIT/aot),
# MLA_PROBLEM (the problem), TUNE_SECONDS (60), PYTHON (python3), MLA_DB (the tuning database; default
# OUT_DIR/mla.db; elsewhere, OUT_DIR/mla.db gets a copy without the builds' cubins, which resuming
# compiles again: a GPU call's OUT then stays small).
# Writes OUT_DIR/mla.db, tune.log, mla.cu, export.log, compare.log, compare.json.
set -uo pipefail

usage="usage: tools/mla_prefill_bar.sh OUT_DIR [--dry-run]"
[[ $# -ge 1 && $1 != -* ]] || { echo "$usage" >&2; exit 2; }
out=$1
dry=0
[[ ${2:-} == --dry-run ]] && dry=1
[[ $# -le 2 && ( $# -eq 1 || $dry -eq 1 ) ]] || { echo "$usage" >&2; exit 2; }
A=${ATTNTUNE_BIN:-}
[[ -n $A ]] || { A=build/attntune; [[ -x .gpubin/attntune ]] && A=.gpubin/attntune; }
export ATTNTUNE_SOURCE_DIR=${ATTNTUNE_SOURCE_DIR:-$PWD}
P=${MLA_PROBLEM:-b=1,h=128,s=8192,d=192,dv=128,dtype=bf16,causal=1}
kit=${FA4_KIT:-.fa4}
aot=${FA4_AOT:-$kit/aot}
py=${PYTHON:-python3}
secs=${TUNE_SECONDS:-60}
db=${MLA_DB:-$out/mla.db}
(( dry )) && db=$out/dry-run.db  # never a real database: tune stops before writing, the file goes after
mkdir -p "$out" || exit 1
[[ -x $A ]] || { echo "no attntune binary at $A (ATTNTUNE_BIN)" >&2; exit 1; }
[[ -f $kit/compare.py ]] || { echo "no FA4 kit at $kit (FA4_KIT; see this script's header)" >&2; exit 1; }
grep -q head_dim_v "$kit/fa4kit.py" ||
  { echo "$kit is not patched with tools/fa4_headdim_v.patch (see this script's header)" >&2; exit 1; }

tune=("$A" tune --db "$db" --space search_spaces/flash_fwd_wgmma.yaml --problem "$P"
      --budget-time "${secs}s" --final-top 4 --final-rounds 3 --final-min-seconds 0.5 --log-interval 30)
compare=("$py" "$kit/compare.py" "$out/mla.cu" --aot "$aot" --contenders ours,fa4,cudnn,flash
         --json "$out/compare.json")

if (( dry )); then
  echo "== $A tune (no GPU here: expect exit 3 after the flags and the problem are read)"
  "${tune[@]}" > "$out/tune.log" 2>&1
  rc=$?
  rm -f "$db"
  tail -2 "$out/tune.log"
  [[ $rc == 3 ]] || { echo "tune: exit $rc (3 expected without a GPU)" >&2; exit 1; }
  echo "== export of $P from the shipped database (the tuned database's stand-in)"
  "$A" export --problem "$P" -o "$out/mla.cu" > "$out/export.log" 2>&1 ||
    { cat "$out/export.log" >&2; exit 1; }
  tail -1 "$out/export.log"
  echo "== compare.py --dry-run"
  "${compare[@]}" --dry-run || exit 1
  echo "dry run ok: on the GPU machine, tools/mla_prefill_bar.sh OUT_DIR (carry $kit and ${A%/*})"
  exit 0
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader || true
t0=$SECONDS
"${tune[@]}" > "$out/tune.log" 2>&1 || { echo "tune failed (exit $?):" >&2; tail -5 "$out/tune.log" >&2; exit 1; }
echo "tune: $((SECONDS - t0)) s; $(grep -c . "$out/tune.log") log lines; its last:"
tail -4 "$out/tune.log"
"$A" export --db "$db" --all-best --no-shipped -o "$out/mla.cu" > "$out/export.log" 2>&1 ||
  { echo "export failed:" >&2; cat "$out/export.log" >&2; exit 1; }
tail -1 "$out/export.log"
if [[ $db != "$out/mla.db" ]]; then  # the results without the cubins (tens of MB)
  "$py" - "$db" "$out/mla.db" <<'EOF' || echo "no copy of $db in $out" >&2
import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.execute("delete from builds")
dst.commit()
dst.execute("vacuum")
EOF
fi
t0=$SECONDS
"${compare[@]}" > "$out/compare.log" 2>&1 || echo "compare.py failed (exit $?): $(tail -3 "$out/compare.log")" >&2
echo "compare: $((SECONDS - t0)) s"
sed -n '/^=== forward/,$p' "$out/compare.log"
"$py" - "$out/compare.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"\n=== MLA prefill on {doc['env'].get('gpu', '?')} (one process, interleaved, median of rounds) ===")
for r in doc["results"]:
    p, c = r["problem"], r["contenders"]
    print(f"{r['name']}: b{p['b']} h{p['h']} s{p['s']} d{p['d']} dv{p.get('dv', p['d'])} {p['dtype']}"
          f"{' causal' if p['causal'] else ''}, {r['flops'] / 1e12:.3f} TFLOP (2*b*h*pairs*(d+dv))")
    print(f"  {'':6s} {'us':>9s} {'TFLOP/s':>8s} {'max|err|':>9s}")
    for n in ("ours", "fa4", "cudnn", "flash"):
        d = c.get(n)
        if d is None:
            continue
        err = f"{d['maxdiff']:9.2e}" if isinstance(d.get("maxdiff"), float) else f"{'-':>9s}"
        if "us" in d:
            print(f"  {n:6s} {d['us']:9.1f} {d['tflops']:8.1f} {err}" + (" NONFINITE" if d.get("nonfinite") else ""))
        else:
            print(f"  {n:6s} {'-':>9s} {'-':>8s} {err}  {(d.get('error') or 'no timing')[:110]}")
    o, f = c.get("ours", {}), c.get("fa4", {})
    bar = []
    if "us" in o and "us" in f:
        x = f["us"] / o["us"]
        bar.append(f"ours/fa4 = {x:.3f} (>= 1.0: {'met' if x >= 1.0 else 'NOT met'})")
    else:
        bar.append("ours/fa4: not measured (" + (f.get("error") or o.get("error") or "?")[:80] + ")")
    if "tflops" in o:
        bar.append(f"ours {o['tflops']:.1f} TFLOP/s (>= 550: {'met' if o['tflops'] >= 550 else 'NOT met'})")
    if "us" in o and "us" in c.get("cudnn", {}):
        bar.append(f"ours/cudnn = {c['cudnn']['us'] / o['us']:.3f}")
    print("  bar: " + "; ".join(bar))
EOF
