#!/usr/bin/env python3
"""Do this repository's FA4 kit patches (tools/fa4_*.patch) apply to a fresh copy of the kit, alone and
together, in every order, without fuzz? docs/EXPORT.md promises they do; a new or edited patch is
checked with this before it is committed.

    python3 tools/check_fa4_patches.py [--kit ../shared/peers/fa4] [PATCH ...]   (default: tools/fa4_*.patch)

Every ordered selection of the patches is applied with `patch -p1 --fuzz=0` to a fresh copy of the kit,
except that fa4_bwd_varlen.patch goes on top of fa4_bwd.patch and fa4_varlen.patch (it patches their
code), so a selection with it and without both of them before it is skipped. Then each patched copy's
Python files must compile. Exit 0 when every selection applies, 1 otherwise (the failures are listed).
"""
import argparse
import glob
import itertools
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDS = {"fa4_bwd_varlen.patch": ("fa4_bwd.patch", "fa4_varlen.patch")}  # patch: those applied before it


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("patches", nargs="*", help="patch files (default: tools/fa4_*.patch)")
    ap.add_argument("--kit", default=os.path.join(ROOT, "..", "shared", "peers", "fa4"), help="the FA4 peer kit")
    a = ap.parse_args()
    patches = [os.path.abspath(p) for p in (a.patches or sorted(glob.glob(os.path.join(ROOT, "tools", "fa4_*.patch"))))]
    if not os.path.isfile(os.path.join(a.kit, "fa4kit.py")):
        sys.exit(f"check_fa4_patches.py: no FA4 kit at {a.kit} (--kit)")
    if not shutil.which("patch"):
        sys.exit("check_fa4_patches.py: no `patch` command")
    names = [os.path.basename(p) for p in patches]
    failed, n = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, len(patches) + 1):
            for order in itertools.permutations(range(len(patches)), r):
                seq = [names[i] for i in order]
                if any(seq[j] in NEEDS and not all(x in seq[:j] for x in NEEDS[seq[j]]) for j in range(len(seq))):
                    continue
                n += 1
                kit = os.path.join(tmp, f"k{n}")
                shutil.copytree(a.kit, kit, ignore=shutil.ignore_patterns("aot", "whl", "__pycache__"))
                for dp, _, fs in os.walk(kit):  # the kit may be read-only
                    os.chmod(dp, 0o755)
                    for f in fs:
                        os.chmod(os.path.join(dp, f), 0o644)
                why = None
                for i in order:
                    res = subprocess.run(["patch", "-d", kit, "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i",
                                          patches[i]], capture_output=True, text=True)
                    if res.returncode != 0:
                        out = res.stdout + res.stderr
                        bad = [x.strip() for x in out.splitlines() if "FAILED" in x or "malformed" in x.lower()]
                        why = f"{names[i]} does not apply: {'; '.join(bad) or ' '.join(out.split())[-300:]}"
                        break
                if why is None:
                    for f in glob.glob(os.path.join(kit, "*.py")):
                        try:
                            py_compile.compile(f, cfile=os.path.join(tmp, "x.pyc"), doraise=True)
                        except py_compile.PyCompileError as e:
                            why = f"{os.path.basename(f)} does not compile: {e.msg.strip()[-200:]}"
                            break
                if why:
                    failed.append(f"{' + '.join(seq)}: {why}")
                shutil.rmtree(kit)
    print(f"{n} ordered selections of {len(patches)} patches ({', '.join(names)}): "
          f"{n - len(failed)} apply without fuzz and compile")
    for f in failed:
        print("  FAILED " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
