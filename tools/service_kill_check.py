#!/usr/bin/env python3
"""Kill -9 one serve worker mid-campaign and count what the database kept (docs/design/service.md).

  tools/service_kill_check.py ATTNTUNE DB -- SERVE_ARGS...

Starts `ATTNTUNE serve --db DB SERVE_ARGS`, waits until a worker holds a campaign with at least 5
search evaluations recorded, SIGKILLs that worker, waits for serve to end, then checks per campaign:
done, search evaluations == the budget, no candidate twice, the victim claimed twice, no lease left.
Prints one line per check and exits 1 if any fails. The queue must already be submitted.
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time


def q(db, sql, *args):
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return c.execute(sql, args).fetchall()
    finally:
        c.close()


def main():
    attntune, db = sys.argv[1], sys.argv[2]
    extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    log = open(db + ".serve.log", "w")
    serve = subprocess.Popen([attntune, "serve", "--db", db] + extra, stderr=log)
    victim = None
    deadline = time.time() + 400
    while victim is None and time.time() < deadline and serve.poll() is None:
        time.sleep(0.2)
        rows = q(db, "SELECT l.campaign, l.pid, (SELECT COUNT(*) FROM evaluations e JOIN campaigns c ON "
                     "c.id = e.campaign_id WHERE c.name = l.campaign AND e.phase = 'search') FROM leases l")
        for camp, pid, n in rows:
            if n >= 5:
                victim = (camp, pid, n)
                break
    if victim is None:
        print("FAIL: no campaign seen mid-way")
        serve.kill()
        return 1
    os.kill(victim[1], signal.SIGKILL)
    t_kill = time.time()
    rc = serve.wait(timeout=600)
    ok = True

    def check(cond, what):
        nonlocal ok
        ok &= bool(cond)
        print(("ok   " if cond else "FAIL ") + what)

    check(rc == 0, f"serve exit code {rc}")
    jobs = q(db, "SELECT campaign, state, attempts, request FROM queue")
    counts = {name: (n, d) for name, n, d in q(
        db, "SELECT c.name, SUM(e.phase = 'search'), COUNT(DISTINCT CASE WHEN e.phase = 'search' THEN e.candidate_id "
            "END) FROM campaigns c JOIN evaluations e ON e.campaign_id = c.id GROUP BY c.id")}
    lost = dup = 0
    for name, state, attempts, request in jobs:
        budget = json.loads(request)["budget_evals"]
        n, d = counts.get(name, (0, 0))
        check(state == "done", f"{name}: {state}, {n} evaluations of budget {budget}, {d} distinct, "
                               f"claimed {attempts}x")
        lost += max(0, budget - n)
        dup += n - d
    check(lost == 0, f"evaluations lost: {lost}")
    check(dup == 0, f"evaluations duplicated: {dup}")
    vic = [a for name, _, a, _ in jobs if name == victim[0]]
    check(vic == [2], f"victim {victim[0]} (worker pid {victim[1]}, killed at {victim[2]} evaluations) claimed "
                      f"{vic[0] if vic else 0} times")
    check(q(db, "SELECT COUNT(*) FROM leases")[0][0] == 0, "no lease left")
    print(f"serve ended {time.time() - t_kill:.1f} s after the kill")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
