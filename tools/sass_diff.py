#!/usr/bin/env python3
"""Do two attntune binaries build the same machine code for a space's configs?

A kernel template change that must not change plain builds (a variant compiled in under #if, a
refactor into headers) is checked here without a GPU: each binary (templates are embedded, so a
binary is a version of the templates) NVRTC-compiles the same fixed sample of a space's valid
configs for a problem (`attntune compile --sample N --seed S --db`), the cubins come out of the
build cache by source hash, and `cuobjdump --dump-sass` of each pair is compared after dropping
what only names the source (addresses in comments, the file's own name). Exit 0 when every pair
is identical, 1 otherwise (the first differing lines of each are printed). A tunable the new space
adds at its old value (--new-param pack_gqa=false) is left out of the new configs' names, so that
they pair with the old ones.

    tools/sass_diff.py --before /tmp/attntune-before --after build/attntune \
        --space search_spaces/flash_fwd_mma.yaml --problem b=1,h=8,s=256,d=64,dtype=bf16,causal=1 \
        --arch sm_90 --sample 8
"""
import argparse
import difflib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile


def build(binary, args, workdir, tag):
    db = os.path.join(workdir, f"{tag}.db")
    space = args.space_before if tag == "before" and args.space_before else args.space
    cmd = [binary, "compile", "--space", space, "--problem", args.problem, "--arch", args.arch,
           "--sample", str(args.sample), "--seed", str(args.seed), "--db", db, "--format", "json",
           "--jobs", str(args.jobs)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    con = sqlite3.connect(db)
    result = {}
    for r in rows:
        config = dict(r["config"])
        if tag == "after":  # a tunable the new space adds, at the value the old builds had
            for name, value in args.new_param:
                if str(config.get(name)).lower() == value.lower():
                    del config[name]
        key = json.dumps(config, sort_keys=True)
        if r["status"] != "ok":
            result[key] = (r["status"], None, r)
            continue
        blob = con.execute("SELECT cubin FROM builds WHERE source_hash = ? AND arch = ?",
                           (r["source_hash"], r["arch"])).fetchone()[0]
        result[key] = ("ok", blob, r)
    return result


def sass(blob, workdir, cuobjdump):
    """A cubin's SASS as lines, without what only names the source (instruction addresses, the
    file's name). Safe to call from several threads (tools/rehash_db.py does)."""
    fd, path = tempfile.mkstemp(suffix=".cubin", dir=workdir)
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    try:
        text = subprocess.run([cuobjdump, "--dump-sass", path], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    # Per function; a function that does nothing (exits: an entry point every build
    # of a family has, that does something in some builds only) is left out, so that a build that
    # gains such an entry point compares equal to one without it.
    functions, current = [], []
    for line in text.splitlines():
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # instruction addresses
        if "Fatbin" in line or "code for" in line or "Function :" in line and "attntune" in line:
            continue
        if "Function :" in line:
            functions.append(current)
            current = []
        current.append(line.rstrip())
    functions.append(current)
    lines = []
    for f in functions:
        ops = [re.sub(r"/\*.*?\*/", "", x).strip() for x in f if "Function :" not in x]
        ops = [x.rstrip(" ;") for x in ops if x and not x.startswith(".") and re.match(r"^[A-Z@]", x)]
        idle = ("EXIT", "NOP", "LDC R1, c[0x0][0x28]")  # the stack pointer's load, then exit
        if any("Function :" in x for x in f) and ops and all(o in idle or o.startswith("BRA ") for o in ops):
            continue
        lines.extend(f)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="attntune binary with the old templates")
    ap.add_argument("--after", required=True, help="attntune binary with the new templates")
    ap.add_argument("--space", required=True)
    ap.add_argument("--space-before", help="the old binary's space file where the new one has keys it cannot read "
                    "(a new problem key: the configs must be the same); default --space")
    ap.add_argument("--new-param", action="append", default=[], type=lambda t: tuple(t.split("=", 1)),
                    metavar="NAME=VALUE", help="a tunable the new space adds (with its `default:`, the old builds' "
                    "value): the new configs that give it VALUE are compared with the old ones that lack it; "
                    "sample a problem where it takes no other value (repeatable)")
    ap.add_argument("--common", action="store_true", help="compare the configs both binaries build and list "
                    "how many only the new one has (a space that gained values or tunables: pass a --sample at "
                    "least its count, so that both build every config); the old one's must all be there")
    ap.add_argument("--problem", required=True)
    ap.add_argument("--arch", required=True)
    ap.add_argument("--sample", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"),
                    help="cuobjdump (the toolkit's, or PyPI's nvidia-cuda-cuobjdump wheel where the toolkit lacks it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a = build(args.before, args, tmp, "before")
        b = build(args.after, args, tmp, "after")
        if args.common and set(a) <= set(b):
            print(f"{len(set(b) - set(a))} configs only the new binary builds are left out; {len(a)} compared")
            b = {key: b[key] for key in a}
        if set(a) != set(b):
            print("the two binaries sample different configs (the space changed its enumeration)")
            return 1
        same = 0
        for key in sorted(a):
            (sa, ba, ra), (sb, bb, rb) = a[key], b[key]
            if sa != sb:
                print(f"DIFF {key}: status {sa} -> {sb}")
                continue
            if sa != "ok":
                same += 1
                continue
            la, lb = sass(ba, tmp, args.cuobjdump), sass(bb, tmp, args.cuobjdump)
            if la == lb:
                same += 1
                print(f"same {key} ({ra['registers']} registers, {len(la)} SASS lines)")
            else:
                # How much differs, and from which line: a prologue's renamed registers differ in a
                # few lines near the top, a changed loop in many.
                ops = [o for o in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes() if o[0] != "equal"]
                changed = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops)
                print(f"DIFF {key}: registers {ra['registers']} -> {rb['registers']}, spills "
                      f"{ra['spill_stores']} -> {rb['spill_stores']}; {changed} of {len(la)} lines differ, "
                      f"lines {ops[0][1] + 1}-{ops[-1][2]} of the old")
                shown = 0
                for x, y in zip(la, lb):
                    if x != y and shown < 5:
                        print(f"  - {x.strip()}\n  + {y.strip()}")
                        shown += 1
        print(f"{same} of {len(a)} configs build the same machine code")
        return 0 if same == len(a) else 1


if __name__ == "__main__":
    sys.exit(main())
