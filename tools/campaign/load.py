#!/usr/bin/env python3
"""Load on a `longhaul serve`: N jobs submitted while M clients follow
/api/events. Reports submit latency (p50/p99), whether every job ended
done exactly once, whether every event client saw every job's `done`, and
the service's peak RSS. Standard library only; loopback only.

    python3 tools/campaign/load.py PATH/TO/longhaul MODEL_DIR [--jobs 1000] [--clients 50]
"""

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import Service, follow


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s = Service(a.binary, Path(tmp) / "data")
        try:
            s.request("POST", "/api/models", {"name": "m", "path": a.model})
            stop = threading.Event()
            seen = [set() for _ in range(a.clients)]

            def seer(done):
                return lambda job: job.get("state") == "done" and done.add(job["id"])

            followers = [threading.Thread(target=follow, args=(s, seer(d), stop), daemon=True)
                         for d in seen]
            for f in followers:
                f.start()
            time.sleep(1)
            latencies, ids = [], []
            started = time.monotonic()
            for i in range(a.jobs):
                t = time.monotonic()
                job = s.request("POST", "/api/jobs",
                                {"model": "m", "prompt": f"task {i}", "max_tokens": 4})
                latencies.append(time.monotonic() - t)
                ids.append(job["id"])
            while True:
                jobs = s.request("GET", "/api/jobs")["jobs"]
                if all(j["state"] in ("done", "failed", "cancelled") for j in jobs):
                    break
                time.sleep(0.5)
            elapsed = time.monotonic() - started
            time.sleep(2)
            states = {}
            for j in jobs:
                states[j["state"]] = states.get(j["state"], 0) + 1
            latencies.sort()
            q = lambda f: round(1000 * latencies[min(len(latencies) - 1, int(f * len(latencies)))], 1)
            every_client = sum(1 for d in seen if set(ids) <= d)
            print(json.dumps({
                "jobs": a.jobs, "clients": a.clients, "listed": len(jobs), "distinct_ids": len(set(ids)),
                "states": states, "clients_saw_every_done": every_client,
                "submit_ms_p50": q(0.5), "submit_ms_p99": q(0.99), "seconds": round(elapsed, 1),
                "peak_rss_MiB": s.peak_rss_mib(),
            }))
            stop.set()
            ok = (len(jobs) == a.jobs and states.get("done") == a.jobs and every_client == a.clients)
            return 0 if ok else 1
        finally:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
