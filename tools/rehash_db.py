#!/usr/bin/env python3
"""Files a database's results under the source an edited template renders, where the edit did not
change their machine code.

`export` refuses a result whose config no longer renders the source that was measured ("the kernel
template has changed"): the source hash is the result's identity. Most template edits here add a
tunable whose default leaves the old builds as they were (its code under `if constexpr` or `#if`),
and the project checks that they compile to the same machine code (tools/sass_diff.py). Their
measurements then stand, but every stored hash is stale, and without this script the only way back
is measuring every campaign again on a GPU (tools/build_shipped_db.sh re-measures stale campaigns).

This script proves it result by result and moves what it proves:

    tools/rehash_db.py --db DB --before OLD_BIN --after NEW_BIN [--family F ...] [--campaign NAME ...]
                       [--space FAMILY=YAML ...] [--top N] [--dry-run]

OLD_BIN is an attntune binary built from the tree the results were measured with (templates are
embedded, so a binary is a version of the templates), NEW_BIN one of this tree. For each campaign,
the candidates of its final ranking and its N fastest search results (default 0; a campaign with no
final ranking, one a time box stopped, its max(N, 10) fastest, since `best` and `export` answer
from its search results), of the families asked (default: every family with a candidate to look at):
  1. NEW_BIN renders and NVRTC-compiles the config for the campaign's problem through the space the
     campaign stored (campaign_spaces.space_text), as `export` renders it, with a constraint pinning
     every parameter to the config's value: the stored hash: nothing to move. (--space FAMILY=YAML
     renders this side through another space instead, a parameter the config lacks at its
     `default:`; the hash moved to is then that space's, which `export` checks only against a
     campaign that stored it: for tests and for spaces rewritten in a database);
  2. OLD_BIN does the same through the space the campaign stored (campaign_spaces.space_text):
     the source hash must be the stored one, else the binary is not the measured tree and nothing
     is moved;
  3. the two cubins' SASS (cuobjdump --dump-sass, instruction addresses aside) must be identical;
     then the candidate row takes the new hash (unless a candidate with that hash exists: left
     alone and reported). cuobjdump: --cuobjdump, else on PATH, in $CUDA_HOME/bin, or the copy
     that PyPI's triton bundles (tools/test.sh's .venv has one).
Every other case is reported and left stale. The database is written in one transaction at the
end (--dry-run: not at all). Exit 0 when nothing was left stale but by --top's choice, 1 when some
result did not carry over (its machine code changed, or a build failed), 2 on bad input.
"""
import argparse
import concurrent.futures
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

import yaml

from sass_diff import sass  # the machine code's comparison, one definition for both tools


UNRANKED_TOP = 10  # the fastest search results looked at in a campaign with no final ranking


def fixed_space(text, config):
    """The space YAML `text` with a constraint pinning each parameter to the config's value (a
    parameter the config lacks: its `default:`), so that the space's one valid config is it. The
    domains stay as they are: an enum's every value is a constant of the rendered source. None if the
    config names a parameter the space lacks, or lacks one without a default."""
    space = yaml.safe_load(text)
    params = space.get("params") or {}
    if set(config) - set(params):
        return None
    pins = []
    for name, spec in params.items():
        if name in config:
            value = config[name]
        elif isinstance(spec, dict) and "default" in spec:
            value = spec["default"]
        else:
            return None
        if isinstance(value, bool):
            expr = name if value else f"!{name}"
        elif isinstance(value, str):
            expr = f"{name} == '{value}'"
        else:
            expr = f"{name} == {value}"
        pins.append({"expr": expr, "why": "tools/rehash_db.py: the config looked at"})
    space["constraints"] = (space.get("constraints") or []) + pins
    return yaml.safe_dump(space, sort_keys=False)


def problem_spec(problem):
    """attntune's problem spec from a campaign's problem JSON (Problem::json())."""
    parts = []
    for k, v in problem.items():
        if isinstance(v, bool):
            v = int(v)
        elif isinstance(v, list):
            v = ",".join(str(x) for x in v)
        parts.append(f"{k}={v}")
    return ",".join(parts)


def find_cuobjdump(root):
    """cuobjdump on PATH, in $CUDA_HOME/bin, or bundled with triton (site-packages, the repo's .venv)."""
    import glob
    import site
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")]
    for d in site.getsitepackages() + glob.glob(os.path.join(root, ".venv", "lib", "python3*", "site-packages")):
        candidates.append(os.path.join(d, "triton", "backends", "nvidia", "bin", "cuobjdump"))
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def compile_one(binary, space_text, spec, arch, db, workdir):
    """(status, source_hash, cubin or None, message) of one config through `binary compile`."""
    fd, path = tempfile.mkstemp(suffix=".yaml", dir=workdir)
    with os.fdopen(fd, "w") as f:
        f.write(space_text)
    try:
        r = subprocess.run([binary, "compile", "--space", path, "--problem", spec, "--arch", arch, "--db", db,
                            "--jobs", "1", "--format", "json"], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        return "error", None, None, (r.stderr.strip().splitlines() or ["?"])[-1]
    rows = json.loads(r.stdout)
    if len(rows) != 1:
        return "error", None, None, f"{len(rows)} configs compiled, not 1"
    row = rows[0]
    if row["status"] != "ok":
        return row["status"], row["source_hash"], None, row["status"]
    con = sqlite3.connect(db, timeout=60)
    blob = con.execute("SELECT cubin FROM builds WHERE source_hash = ? AND arch = ?",
                       (row["source_hash"], row["arch"])).fetchone()[0]
    con.close()
    return "ok", row["source_hash"], blob, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--before", required=True, help="attntune built from the tree the results were measured with")
    ap.add_argument("--after", required=True, help="attntune built from this tree")
    ap.add_argument("--family", action="append", default=[], help="only these families (repeatable)")
    ap.add_argument("--campaign", action="append", default=[], help="only these campaigns (repeatable)")
    ap.add_argument("--space", action="append", default=[], metavar="FAMILY=YAML",
                    help="render the new side through this space instead of the campaign's stored one (tests; spaces rewritten in a database)")
    ap.add_argument("--top", type=int, default=0, help="also each campaign's N fastest search results")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--cuobjdump", help="cuobjdump (default: found as the docstring says)")
    args = ap.parse_args()
    if not os.path.exists(args.db):
        print(f"rehash_db.py: no database {args.db}", file=sys.stderr)
        return 2
    for b in (args.before, args.after):
        if not os.access(b, os.X_OK):
            print(f"rehash_db.py: {b} is not an executable", file=sys.stderr)
            return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spaces = {}
    for s in args.space:
        fam, _, path = s.partition("=")
        spaces[fam] = path

    con = sqlite3.connect(args.db)
    con.row_factory = sqlite3.Row
    # The candidates to look at: each campaign's ranked ones and its --top fastest ok search results;
    # a campaign with no final ranking (stopped by a time box: `best` answers from its search) its
    # UNRANKED_TOP fastest at least (SQLite's LIMIT cannot see the outer row: a second query).
    query = """SELECT c.id AS campaign_id, c.name, c.problem, k.id AS candidate_id, k.family, k.config, k.config_key,
                  k.source_hash, cs.space_text
           FROM campaigns c
           JOIN candidates k ON k.id IN (
               SELECT candidate_id FROM rankings WHERE campaign_id = c.id
               UNION
               SELECT candidate_id FROM (
                   SELECT candidate_id, MIN(median_us) AS t FROM evaluations
                   WHERE campaign_id = c.id AND status = 'ok' GROUP BY candidate_id ORDER BY t LIMIT ?))
           JOIN campaign_spaces cs ON cs.campaign_id = c.id AND cs.family = k.family
           WHERE EXISTS (SELECT 1 FROM rankings r WHERE r.campaign_id = c.id) = ?
           ORDER BY c.id"""
    rows = con.execute(query, (args.top, 1)).fetchall() + con.execute(query, (max(args.top, UNRANKED_TOP), 0)).fetchall()
    rows.sort(key=lambda r: r["campaign_id"])
    if args.family:
        rows = [r for r in rows if r["family"] in args.family]
    if args.campaign:
        missing = set(args.campaign) - {r["name"] for r in con.execute("SELECT name FROM campaigns")}
        if missing:
            print(f"rehash_db.py: no campaign {sorted(missing)[0]!r} in {args.db}", file=sys.stderr)
            return 2
        rows = [r for r in rows if r["name"] in args.campaign]
    cuobjdump = args.cuobjdump or find_cuobjdump(root)
    # One job per (family, problem, config): candidates of the same source share it.
    jobs = {}
    for r in rows:
        key = (r["family"], r["problem"], r["config_key"], r["source_hash"])
        jobs.setdefault(key, []).append(r)

    @functools.lru_cache(maxsize=None)  # a campaign space's text parsed once, not once a job
    def arch_of(space_text):
        archs = yaml.safe_load(space_text).get("archs") or []
        return archs[-1] if archs else "sm_90"

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        def run(key):
            fam, problem, _, stored = key
            r = jobs[key][0]
            config = json.loads(r["config"])
            spec = problem_spec(json.loads(problem))
            old_space = fixed_space(r["space_text"], config)
            if old_space is None:
                return "input", "the stored space does not hold the config"
            # `export` renders a result through the space its campaign stored, so the hash it checks
            # is NEW_BIN's rendering through that space (a tunable the campaign's space lacks is the
            # template's default). Through this tree's space, a new tunable's #define would give a
            # hash no export renders: run 278's first rehash moved 370 results and left 186
            # campaigns stale that way.
            new_space = old_space
            if fam in spaces:
                with open(spaces[fam]) as f:
                    new_space = fixed_space(f.read(), config)
                if new_space is None:
                    return "input", "the --space file does not hold the config (a parameter gone, or new without a default)"
            arch = arch_of(r["space_text"])
            # A build cache of its own a job (SQLite takes one writer at a time).
            job = tempfile.mkdtemp(dir=tmp)
            before_db, after_db = os.path.join(job, "before.db"), os.path.join(job, "after.db")
            s1, h1, c1, m1 = compile_one(args.after, new_space, spec, arch, after_db, tmp)
            if h1 == stored:
                # The stored source, but does it still build (export would hand it over)?
                return ("fresh", "") if s1 == "ok" else ("build", f"the stored source no longer builds: {m1 or s1}")
            s0, h0, c0, m0 = compile_one(args.before, old_space, spec, arch, before_db, tmp)
            if h0 != stored:
                return "not-the-tree", f"--before renders {h0 and h0[:12]} ({m0 or s0}), the result {stored[:12]}"
            if s0 != "ok" or s1 != "ok":
                return "build", f"builds {s0} / {s1}: {m0 or m1}"
            if not cuobjdump:
                return "build", "no cuobjdump to compare the machine code with (--cuobjdump)"
            if sass(c0, tmp, cuobjdump) != sass(c1, tmp, cuobjdump):
                return "changed", "the machine code differs"
            return "same", h1

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for key, res in zip(jobs, pool.map(run, jobs)):
                results[key] = res

    counts = {}
    updates = []
    for key, (verdict, detail) in results.items():
        counts[verdict] = counts.get(verdict, 0) + 1
        names = sorted({r["name"] for r in jobs[key]})
        if verdict == "same":
            fam, _, config_key, stored = key
            clash = con.execute("SELECT id FROM candidates WHERE family = ? AND config_key = ? AND source_hash = ?",
                                (fam, config_key, detail)).fetchone()
            if clash:
                print(f"kept {names[0]}: {config_key} (a candidate with the new source exists already)")
                counts["clash"] = counts.get("clash", 0) + 1
                continue
            updates.append((detail, jobs[key][0]["candidate_id"]))
        elif verdict != "fresh":
            print(f"{verdict} {names[0]}{' (+%d)' % (len(names) - 1) if len(names) > 1 else ''}: "
                  f"{key[0]} {key[2]}: {detail}")
    if updates and not args.dry_run:
        with con:
            con.executemany("UPDATE candidates SET source_hash = ? WHERE id = ?", updates)
    print(f"{len(jobs)} results looked at: {len(updates)} moved to the new source{' (dry run: not written)' if args.dry_run else ''}, "
          + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()) if v != "same"))
    left = sum(n for v, n in counts.items() if v not in ("same", "fresh"))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
