#!/usr/bin/env python3
"""Does a warm start carry over? Issue 43's transfer bar, measured without a whole main job a shape
(docs/design/shipped_db.md "What the unseen set shows"): for each shape, a new user's short campaign
(`attntune tune` into a database of its own, so that its warm start comes from the shipped file
alone) of N evaluations, then each of those N configs and the shape's reference pick (the rank-1
config of a finished campaign of the same problem, e.g. a 200-evaluation one of tools/bars.sh --set
unseen) timed side by side by `attntune eval`, interleaved round after round, so every config sees
the same clocks under the power cap. A shape's figure is the first n for which the best of its
first n evaluations is within --within percent of the reference pick (none: N + 1); the summary is
the median over the shapes, against the bar (<= 5).

    tools/transfer_check.py --shape NAME PROBLEM REF_DB [--shape ...] --out DIR \\
        [--evals 5] [--seed 1] [--rounds 2] [--min-seconds 1] [--within 2] [--device 0] \\
        [--tune-args "..."] [--json OUT.json]

The binary is $ATTNTUNE_BIN, else build/attntune; the shipped file is whatever tune finds
($ATTNTUNE_SHIPPED_DB on the GPU machine). Each shape's campaign database is DIR/NAME-tSEED.db; a
re-run resumes its campaign (tune does) and times again. `eval` runs with that database, so the
campaign's own builds are reused (one compile a shape: the reference pick's). A config is evaluated
with the search space of its template in this tree (search_spaces/FAMILY.yaml).
Exit 0 when every shape was measured, 1 when some evaluation failed or a shape had no reference, 2
on bad arguments.
"""
import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ab_eval  # noqa: E402  (its eval call)


def config_arg(config):
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)
    return ",".join(f"{k}={value(v)}" for k, v in config.items())


def reference_pick(db, problem_json):
    """(family, config) of the rank-1 config of the finished campaign of this problem in db."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        for cid, prob in con.execute("SELECT id, problem FROM campaigns ORDER BY id"):
            if json.loads(prob) != problem_json:
                continue
            row = con.execute("SELECT k.family, k.config FROM rankings r JOIN candidates k ON k.id = r.candidate_id "
                              "WHERE r.campaign_id = ? AND r.rank = 1", (cid,)).fetchone()
            if row:
                return row[0], json.loads(row[1])
    finally:
        con.close()
    return None


def search_configs(db, name):
    """The campaign's search evaluations in order: (family, config, status)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [(f, json.loads(c), s) for f, c, s in con.execute(
            "SELECT k.family, k.config, e.status FROM evaluations e JOIN campaigns c ON c.id = e.campaign_id "
            "JOIN candidates k ON k.id = e.candidate_id WHERE c.name = ? AND e.phase = 'search' ORDER BY e.seq",
            (name,))]
    finally:
        con.close()


def problem_json_of(db, name):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT problem FROM campaigns WHERE name = ?", (name,)).fetchone()
        return json.loads(row[0]) if row else None
    finally:
        con.close()


def evaluate(binary, family, problem, config, db, a):
    # ab_eval's call of eval, with the campaign's database (its builds reused) and the device.
    return ab_eval.evaluate(binary, os.path.join(ROOT, "search_spaces", family + ".yaml"), problem,
                            config_arg(config), a.min_seconds, a.max_seconds, ("--db", db, "--device", str(a.device)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", nargs=3, required=True, metavar=("NAME", "PROBLEM", "REF_DB"))
    ap.add_argument("--out", required=True, help="a folder for the shapes' campaign databases and tune logs")
    ap.add_argument("--evals", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--within", type=float, default=2.0, help="percent behind the reference pick that counts")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--tune-args", default="", help="more arguments for tune (split on spaces)")
    ap.add_argument("--json", help="write every timing here")
    a = ap.parse_args()
    if a.evals < 1 or a.rounds < 1:
        ap.error("--evals and --rounds must be at least 1")
    names = [s[0] for s in a.shape]
    if len(set(names)) != len(names):
        ap.error(f"shape names must differ: {names}")
    binary = os.environ.get("ATTNTUNE_BIN") or os.path.join(ROOT, "build", "attntune")
    os.makedirs(a.out, exist_ok=True)

    # 1. Each shape's short campaign, from nothing but the shipped file.
    shapes = []
    all_ok = True
    for name, problem, ref_db in a.shape:
        db = os.path.join(a.out, f"{name}-t{a.seed}.db")
        log = os.path.join(a.out, f"{name}-t{a.seed}.log")
        with open(log, "a") as f:
            r = subprocess.run([binary, "tune", "--db", db, "--problem", problem, "--campaign", name, "--seed",
                                str(a.seed), "--budget-evals", str(a.evals), "--final-top", "0", "--device",
                                str(a.device)] + a.tune_args.split(), stdout=f, stderr=subprocess.STDOUT)
        warm = [line.strip() for line in open(log, errors="replace") if line.startswith("warm start:")]
        evals = search_configs(db, name) if os.path.exists(db) else []
        ref = None
        pj = problem_json_of(db, name) if os.path.exists(db) else None
        if pj is not None and os.path.exists(ref_db):
            ref = reference_pick(ref_db, pj)
        if r.returncode != 0 or not evals or ref is None:
            all_ok = False
            why = (f"tune exited {r.returncode}" if r.returncode != 0 else
                   "no search evaluations" if not evals else f"no finished campaign of {problem} in {ref_db}")
            print(f"{name}: {why} (log: {log})", file=sys.stderr)
        shapes.append({"name": name, "problem": problem, "db": db, "warm": warm, "evals": evals[:a.evals],
                       "ref": ref})

    # 2. Its evaluations and the reference pick side by side, interleaved round after round.
    timed = {s["name"]: {"ref": [], "evals": [[] for _ in s["evals"]]} for s in shapes}
    for rnd in range(1, a.rounds + 1):
        for s in shapes:
            if s["ref"] is None or not s["evals"]:
                continue
            runs = [("ref", s["ref"][0], s["ref"][1])] + [(i, f, c) for i, (f, c, _) in enumerate(s["evals"])]
            for key, family, config in runs:
                doc = evaluate(binary, family, s["problem"], config, s["db"], a)
                (timed[s["name"]]["ref"] if key == "ref" else timed[s["name"]]["evals"][key]).append(doc)
                us = doc.get("median_us")
                print(f"round {rnd} {s['name']} {key}: {doc.get('status')} {'' if us is None else f'{us:.2f} us'}",
                      file=sys.stderr, flush=True)

    def median_of(docs):
        ok = [d["median_us"] for d in docs if d.get("status") == "ok" and d.get("median_us") is not None]
        return statistics.median(ok) if len(ok) == len(docs) and ok else None

    # 3. Per shape: the first n whose best so far is within --within percent of the reference pick.
    print(f"\n{'shape':<16s} {'reference us':>12s} {'first ' + str(a.evals) + ' (us, vs reference)':<60s} {'to ' + str(a.within) + '%':>6s}")
    figures, out = [], []
    for s in shapes:
        t = timed[s["name"]]
        ref_us = median_of(t["ref"])
        times = [median_of(d) for d in t["evals"]]
        if ref_us is None or not times:
            all_ok = False
            print(f"{s['name']:<16s} {'-':>12s} {'(not measured)':<60s} {'-':>6s}")
            out.append({"name": s["name"], "problem": s["problem"], "measured": False})
            continue
        if any(x is None for x in times):
            all_ok = False
        n_within, best = None, None
        for n, x in enumerate(times, 1):
            if x is not None and (best is None or x < best):
                best = x
            if n_within is None and best is not None and best <= ref_us * (1 + a.within / 100):
                n_within = n
        figure = n_within if n_within is not None else a.evals + 1
        figures.append(figure)
        cells = " ".join("fail" if x is None else f"{x:.1f}({x / ref_us:.3f})" for x in times)
        print(f"{s['name']:<16s} {ref_us:12.1f} {cells:<60s} {'-' if n_within is None else n_within:>6}")
        out.append({"name": s["name"], "problem": s["problem"], "measured": True, "warm_start": s["warm"],
                    "reference": {"template": s["ref"][0], "config": s["ref"][1], "median_us": ref_us,
                                  "timings": t["ref"]},
                    "evaluations": [{"template": f, "config": c, "search_status": st, "median_us": x, "timings": d}
                                    for (f, c, st), x, d in zip(s["evals"], times, t["evals"])],
                    "evals_to_within": n_within})
    if figures:
        print(f"transfer: median {statistics.median(figures):g} evaluations to within {a.within:g}% of the reference "
              f"pick over {len(figures)} shapes ({a.evals + 1}: not within {a.evals}; bar: <= 5)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
