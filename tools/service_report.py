#!/usr/bin/env python3
"""Figures of a served plan, from its database (docs/design/service.md):

  * campaigns per hour: done campaigns / (last end - first start) of the served queue;
  * time to within 2% of each campaign's final best: from the campaign's start to the first search
    evaluation whose median is within 2% of the best median its search found (the same timing as
    the evaluations it is compared with; the final re-timing samples longer and is not used);
  * the warm-start figure of issue 27: the first campaign's time-to-2% over the median of the
    last ten campaigns' (those warm-start from finished neighbours);
  * per template, the search evaluations a campaign needed to come within 2% (median, how many at
    the first, how many within 5: issue 43's transfer figure).
A database without a queue (`tune` runs; the shipped database, whose queue is dropped) is read
from its campaigns, in the order they started.

  tools/service_report.py DB [--json]
"""
import argparse
import datetime
import json
import sqlite3
import statistics
import sys


def ts(text):
    return datetime.datetime.strptime(text.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    db = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT q.campaign, q.state, q.started_at, q.ended_at, c.id, c.started_at, d.name "
        "FROM queue q LEFT JOIN campaigns c ON c.name = q.campaign LEFT JOIN devices d ON d.id = c.device_id "
        "ORDER BY q.started_at IS NULL, q.started_at").fetchall()
    if not rows:
        # No queue: a database of `tune` runs, or one whose queue was dropped (the shipped database,
        # tools/build_shipped_db.sh): the campaigns themselves, in the order they started.
        rows = db.execute(
            "SELECT c.name, CASE c.status WHEN 'completed' THEN 'done' ELSE c.status END, c.started_at, "
            "c.ended_at, c.id, c.started_at, d.name FROM campaigns c LEFT JOIN devices d ON d.id = c.device_id "
            "ORDER BY c.started_at").fetchall()
    out = []
    for name, state, q_start, q_end, cid, c_start, gpu in rows:
        if cid is None:
            out.append({"campaign": name, "state": state})
            continue
        evals = db.execute(
            "SELECT seq, median_us, evaluated_at FROM evaluations WHERE campaign_id = ? AND phase = 'search' "
            "AND status = 'ok' ORDER BY seq", (cid,)).fetchall()
        first_eval = db.execute("SELECT MIN(evaluated_at) FROM evaluations WHERE campaign_id = ?", (cid,)).fetchone()[0]
        n = db.execute("SELECT COUNT(*) FROM evaluations WHERE campaign_id = ? AND phase = 'search'", (cid,)).fetchone()[0]
        rec = {"campaign": name, "state": state, "gpu": gpu, "evaluations": n}
        if q_start and q_end:
            rec["seconds"] = ts(q_end) - ts(q_start)
        if evals:
            best = min(m for _, m, _ in evals)
            hit = next((s, t) for s, m, t in evals if m <= best * 1.02)
            rec["best_us"] = best
            rec["evals_to_2pct"] = hit[0]
            rec["seconds_to_2pct"] = ts(hit[1]) - ts(q_start or c_start)
        out.append(rec)
    done = [r for r in out if r.get("state") == "done" and "seconds" in r]
    summary = {"campaigns": len(out), "done": len(done)}
    starts = [ts(r[2]) for r in rows if r[2]]
    ends = [ts(r[3]) for r in rows if r[3]]
    if done and starts and ends:
        span = max(ends) - min(starts)
        summary["wall_seconds"] = span
        summary["campaigns_per_hour"] = len(done) * 3600 / span
    timed = [r for r in out if "seconds_to_2pct" in r]
    if len(timed) >= 11:
        first = timed[0]["seconds_to_2pct"]
        last10 = statistics.median(r["seconds_to_2pct"] for r in timed[-10:])
        summary["first_seconds_to_2pct"] = first
        summary["last10_median_seconds_to_2pct"] = last10
        summary["first_over_last10"] = first / last10 if last10 > 0 else None
        summary["first_evals_to_2pct"] = timed[0]["evals_to_2pct"]
        summary["last10_median_evals_to_2pct"] = statistics.median(r["evals_to_2pct"] for r in timed[-10:])
    # Per template (the campaign name's part before ':', a plan's campaigns; else the campaigns'
    # own names are one group): how many search evaluations a campaign needed to come within 2% of
    # its search's best, which with warm starts is what the seeds from its neighbours are worth.
    groups = {}
    for r in timed:
        groups.setdefault(r["campaign"].split(":")[0] if ":" in r["campaign"] else "(unplanned)", []).append(
            r["evals_to_2pct"])
    if timed:
        groups["all"] = [r["evals_to_2pct"] for r in timed]
    summary["evals_to_2pct"] = {
        k: {"campaigns": len(v), "median": statistics.median(v), "at_1": sum(1 for e in v if e <= 1),
            "within_5": sum(1 for e in v if e <= 5)} for k, v in groups.items()}
    if a.json:
        json.dump({"summary": summary, "campaigns": out}, sys.stdout, indent=2)
        print()
        return
    print(f"{'campaign':<80} {'state':<7} {'evals':>5} {'s':>6} {'to 2%':>6} {'#':>3}")
    for r in out:
        print(f"{r['campaign'][:80]:<80} {r.get('state',''):<7} {r.get('evaluations',0):>5} "
              f"{r.get('seconds',0):>6.1f} {r.get('seconds_to_2pct',0):>6.1f} {r.get('evals_to_2pct',0):>3}")
    for k, v in summary.items():
        if k == "evals_to_2pct":
            for g, f in v.items():
                print(f"evaluations to within 2% [{g}]: median {f['median']}, at the first {f['at_1']} "
                      f"of {f['campaigns']}, within 5 {f['within_5']}")
            continue
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
