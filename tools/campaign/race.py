#!/usr/bin/env python3
"""Racing job actions on a `longhaul serve`: many threads cancel, pause,
resume, move, delete, show, export and submit the same few jobs at once.
Afterwards every paused job is resumed and the queue must drain. Passes
when no request got a 5xx (or no answer), every error is JSON naming what
is wrong, every job that finished `done` has exactly the text an
uninterrupted run of its prompt gives, the runner still takes a new job,
and the database passes `PRAGMA integrity_check`. Standard library only;
loopback only.

    python3 tools/campaign/race.py PATH/TO/longhaul MODEL_DIR [--actions 600] [--threads 8]
"""

import argparse
import collections
import json
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import Service

PROMPTS = ["Audit the storage layer", "Draft an architecture", "Review main.rs", "Name the risks"]
ENDED = ("done", "failed", "cancelled")


def body(prompt):
    return {"model": "m", "prompt": prompt, "max_tokens": 24, "temperature": 0}


def act(s, rng, ids, prompts, lock):
    """One random action on one of the jobs; returns (action, status, answer)."""
    # The running job a third of the time, so actions meet the runner as
    # well as the queue; else one of the newest, or one that never was.
    running = []
    if rng.random() < 0.35:
        running = [j["id"] for j in s.request("GET", "/api/jobs")["jobs"] if j["state"] == "running"]
    with lock:
        id = rng.choice(running or ids[-12:]) if rng.random() > 0.03 else 999_999
    kind = rng.choice(["cancel", "pause", "resume", "resume", "move", "delete",
                       "show", "export", "submit", "bogus"])
    if kind in ("cancel", "pause", "resume", "bogus"):
        status, answer = s.call("POST", f"/api/jobs/{id}/{kind}", {})
    elif kind == "move":
        index = rng.choice([0, 1, 3, -1, 10_000, "x"])
        status, answer = s.call("POST", f"/api/jobs/{id}/move", {"index": index})
    elif kind == "delete":
        status, answer = s.call("DELETE", f"/api/jobs/{id}")
    elif kind == "show":
        status, answer = s.call("GET", f"/api/jobs/{id}")
    elif kind == "export":
        status, answer = s.call("GET", f"/api/jobs/{id}/export?format={rng.choice(['json', 'markdown'])}")
    else:
        prompt = rng.choice(PROMPTS)
        status, answer = s.call("POST", "/api/jobs", body(prompt))
        if status < 300:
            with lock:
                ids.append(answer["id"])
                prompts[answer["id"]] = prompt
    return kind, status, answer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--actions", type=int, default=600)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        s = Service(a.binary, data, faults="token-delay-ms=25")
        problems = []
        try:
            s.request("POST", "/api/models", {"name": "m", "path": a.model})
            reference = {}
            for prompt in PROMPTS:
                job = s.request("POST", "/api/jobs", body(prompt))
                reference[prompt] = s.wait(job["id"], ENDED)["output"]
            prompts = {}
            for i in range(16):
                prompts[s.request("POST", "/api/jobs", body(PROMPTS[i % 4]))["id"]] = PROMPTS[i % 4]
            ids = list(prompts)
            lock = threading.Lock()
            results = []
            started = time.monotonic()

            def worker(n):
                rng = random.Random(a.seed * 1000 + n)
                for _ in range(a.actions // a.threads):
                    time.sleep(rng.random() * 0.08)
                    try:
                        results.append(act(s, rng, ids, prompts, lock))
                    except Exception as e:  # no answer at all
                        results.append(("?", 0, repr(e)))

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(a.threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            racing = time.monotonic() - started
            statuses = collections.Counter(status for _, status, _ in results)
            for kind, status, answer in results:
                if status >= 500 or status == 0:
                    problems.append(f"{kind}: {status} {answer}")
                elif status >= 400 and not (isinstance(answer, dict) and answer.get("error")):
                    problems.append(f"{kind}: {status} without a JSON error: {answer}")
            # Drain: resume whatever is paused until every job has ended.
            began = time.monotonic()
            while True:
                jobs = s.request("GET", "/api/jobs")["jobs"]
                for j in jobs:
                    if j["state"] == "paused":
                        s.call("POST", f"/api/jobs/{j['id']}/resume", {})
                if all(j["state"] in ENDED for j in jobs):
                    break
                if time.monotonic() - began > 600:
                    problems.append(f"queue never drained: {[(j['id'], j['state']) for j in jobs if j['state'] not in ENDED]}")
                    break
                time.sleep(0.2)
            states = collections.Counter(j["state"] for j in jobs)
            changed, resumed = 0, 0
            for j in jobs:
                full = s.job(j["id"])
                prompt = prompts.get(j["id"])
                resumed += full["state"] == "done" and full["stats"]["resumes"] > 0
                if full["state"] == "done" and prompt and full["output"] != reference[prompt]:
                    changed += 1
                    problems.append(f"job {j['id']} finished with other text than its prompt gives")
                if full["state"] == "failed":
                    problems.append(f"job {j['id']} failed: {full.get('error')}")
            last = s.request("POST", "/api/jobs", body(PROMPTS[0]))
            after = s.wait(last["id"], ENDED, limit=120)
            if after["output"] != reference[PROMPTS[0]]:
                problems.append(f"a job after the race: {after['state']} {after.get('error')}")
            rss = s.peak_rss_mib()
        finally:
            s.stop()
        integrity = sqlite3.connect(data / "queue.sqlite").execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            problems.append(f"integrity_check: {integrity}")
        print(json.dumps({
            "actions": len(results), "threads": a.threads, "seconds": round(racing, 1),
            "statuses": dict(sorted(statuses.items())),
            "by_action": {k: dict(collections.Counter(st for kk, st, _ in results if kk == k))
                          for k in sorted({k for k, _, _ in results})},
            "jobs_after": dict(states), "done_with_other_text": changed,
            "done_after_a_pause_or_stop": resumed,
            "integrity_check": integrity, "peak_rss_MiB": rss,
            "problems": problems[:20],
        }, indent=1))
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
