#!/usr/bin/env python3
"""Times configs (or builds of the templates) side by side on the GPU machine: `attntune eval` of each
run on each problem, interleaved round after round, so that every run sees the same clocks and power
cap (docs/design/evaluation.md "The power cap"); a table per problem last, each run's time against
the first run's.

    tools/ab_eval.py --problem P [--problem P ...] \\
        --run LABEL BIN SPACE CONFIG [--run LABEL BIN SPACE CONFIG ...] \\
        [--rounds 3] [--min-seconds 1] [--max-seconds 2] [--budget-seconds S] [--json OUT.json]

A run is a label, an attntune binary (templates are embedded, so a binary is a version of the
kernels: a build of another tree is how a template change is A/B'd), a search space (the binary's
own: a space that names a tunable the binary's templates lack cannot render) and a config (every
parameter of the space, k=v,...). `eval` checks each result against the reference before timing it;
a run that fails a check, a build or a launch shows its status instead of a time, and the others go
on. Exit 0 when every evaluation was ok, 1 when some was not, 2 on bad arguments, 3 when a SIGTERM
stopped it (after its tables).

Each line: LABEL, the microseconds of each round, their median, TFLOP/s (eval's, from the median) and
`vs first`: the first run's median over this run's (above 1: faster than the first run). Under the
table, each evaluation that was not ok, whole: its run, round, status and eval's error (the figures
that failed a check are at its end, which a table column would cut off).

Device time is boxed, so a comparison that runs out of it still reports what it measured:
--budget-seconds S starts no round that the last round's duration says would end past S seconds
(whole rounds only: every run keeps the same number), and a SIGTERM (`timeout`, a lease taken back)
ends the evaluation in flight and prints the tables of what is done, the last round perhaps part
done. Either way the table says after how many of the rounds it stopped, and why.
"""
import argparse
import json
import signal
import statistics
import subprocess
import sys
import time


class Stopped(Exception):
    """A SIGTERM: stop measuring, report what is done."""


def _on_term(signum, frame):
    raise Stopped()


def evaluate(binary, space, problem, config, min_s, max_s, extra=()):
    """`attntune eval` of one config (`extra`: more of eval's arguments); its JSON document, or a
    status and the error's last line when it printed none."""
    cmd = [binary, "eval", "--space", space, "--problem", problem, "--config", config,
           "--min-seconds", str(min_s), "--max-seconds", str(max_s), "--format", "json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        doc = json.loads(r.stdout)
        doc = doc[0] if isinstance(doc, list) else doc
    except ValueError:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": f"exit {r.returncode}", "error": last}
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", action="append", required=True, help="a problem spec (repeatable)")
    ap.add_argument("--run", action="append", nargs=4, required=True, metavar=("LABEL", "BIN", "SPACE", "CONFIG"),
                    help="a run: its label, attntune binary, search space and config (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0, help="each eval's least sampling time")
    ap.add_argument("--max-seconds", type=float, default=2.0)
    ap.add_argument("--budget-seconds", type=float,
                    help="start no round that would end past this many seconds (by the last round's duration)")
    ap.add_argument("--json", help="write every evaluation here")
    a = ap.parse_args()
    labels = [r[0] for r in a.run]
    if len(set(labels)) != len(labels):
        ap.error(f"run labels must differ: {labels}")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")

    if a.budget_seconds is not None and a.budget_seconds <= 0:
        ap.error("--budget-seconds must be positive")

    results = {(p, r[0]): [] for p in a.problem for r in a.run}
    stopped = None  # why the rounds ended early
    terminated = False  # by a SIGTERM
    done = 0  # whole rounds
    start = time.monotonic()
    last_round = 0.0
    signal.signal(signal.SIGTERM, _on_term)
    try:
        for rnd in range(1, a.rounds + 1):
            if a.budget_seconds is not None and rnd > 1 and \
                    time.monotonic() - start + last_round > a.budget_seconds:
                stopped = f"--budget-seconds {a.budget_seconds:g}: another round would take about {last_round:.0f} s"
                break
            t0 = time.monotonic()
            for p in a.problem:
                for label, binary, space, config in a.run:
                    doc = evaluate(binary, space, p, config, a.min_seconds, a.max_seconds)
                    results[(p, label)].append(doc)
                    us = doc.get("median_us")
                    print(f"round {rnd} {label} {p}: {doc.get('status')} "
                          f"{'' if us is None else f'{us:.2f} us'}", file=sys.stderr, flush=True)
            last_round = time.monotonic() - t0
            done = rnd
    except Stopped:
        terminated = True
        stopped = "SIGTERM" + (f" in round {done + 1} (part done)" if any(
            len(v) > done for v in results.values()) else "")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if stopped:
        print(f"\nstopped after {done} of {a.rounds} rounds: {stopped}")

    all_ok = True
    out = []
    for p in a.problem:
        print(f"\n{p}")
        width = 10 * max(1, max(len(results[(p, r[0])]) for r in a.run))  # the rounds measured
        print(f"  {'run':<16s} {'us by round':>{width}s} {'median':>10s} {'TFLOP/s':>8s} {'vs first':>9s}")
        first = None
        failed = []  # (label, round, status, error) of each evaluation that was not ok
        for label, *_ in a.run:
            docs = results[(p, label)]
            ok = [d for d in docs if d.get("status") == "ok" and d.get("median_us") is not None]
            all_ok &= len(ok) == len(docs) and len(docs) > 0
            rounds = "".join(f"{d['median_us']:10.2f}" if d in ok else f"{str(d.get('status'))[:9]:>10s}" for d in docs)
            failed += [(label, i + 1, d.get("status"), d.get("error") or "") for i, d in enumerate(docs) if d not in ok]
            if not ok:
                why = next((d.get("error") for d in docs if d.get("error")), "")
                print(f"  {label:<16s} {rounds:>{width}s} {'-':>10s} {'-':>8s} {'-':>9s}  {str(why)[:80]}")
                out.append({"problem": p, "run": label, "evaluations": docs})
                continue
            med = statistics.median(d["median_us"] for d in ok)
            # eval's TFLOP/s is its FLOPs over its own median: the FLOPs (one problem's) over this median
            flops = next((d["tflops"] * d["median_us"] for d in ok if d.get("tflops")), None)
            tflops = flops / med if flops else None
            if first is None:
                first = med
            print(f"  {label:<16s} {rounds:>{width}s} {med:10.2f} {'-' if tflops is None else f'{tflops:8.1f}':>8s} "
                  f"{first / med:9.3f}")
            out.append({"problem": p, "run": label, "median_us": med, "tflops": tflops,
                        "vs_first": first / med, "evaluations": docs})
        for label, rnd, status, error in failed:
            print(f"  {label} round {rnd}: {status}{': ' + error if error else ''}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if terminated:
        return 3
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
