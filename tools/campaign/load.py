#!/usr/bin/env python3
"""Load on a `longhaul serve`: N jobs submitted while M clients follow
/api/events. Reports submit latency (p50/p99), whether every job ended
done exactly once, whether every event client saw every job's `done`, and
the service's peak RSS. Standard library only; loopback only.

    python3 tools/campaign/load.py PATH/TO/longhaul MODEL_DIR [--jobs 1000] [--clients 50] [--rounds 1]
"""

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import Service, follow


def drain(s, last):
    """Waits until every job has ended: the queue runs in order, so until the
    last one submitted has. Only that job is asked for, as a listing of every
    job (about 10 KB each) would make its size part of the memory measured."""
    s.wait(last, ("done", "failed", "cancelled"), limit=3600, poll=0.5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=1,
                   help="submit the jobs this many times over, noting the RSS after each (a leak grows it)")
    p.add_argument("--prefix-ram", help="serve's --prefix-cache-ram (prompt state kept in RAM, 256M by default)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--prefix-cache-ram", a.prefix_ram] if a.prefix_ram else []
        s = Service(a.binary, Path(tmp) / "data", args)
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
            latencies, ids, rss, prefix = [], [], [], []
            started = time.monotonic()
            for i in range(a.jobs * a.rounds):
                t = time.monotonic()
                job = s.request("POST", "/api/jobs",
                                {"model": "m", "prompt": f"task {i}", "max_tokens": 4})
                latencies.append(time.monotonic() - t)
                ids.append(job["id"])
                if (i + 1) % a.jobs == 0:
                    drain(s, ids[-1])
                    rss.append(s.rss_mib())
                    time.sleep(1.5)  # a metrics sample after the round
                    held = ((s.request("GET", "/api/metrics").get("metrics") or {}).get("prefix") or {})
                    prefix.append(round(held.get("ram_bytes", 0) / 2**20, 1))
            elapsed = time.monotonic() - started
            jobs = s.request("GET", "/api/jobs")["jobs"]
            time.sleep(2)
            states = {}
            for j in jobs:
                states[j["state"]] = states.get(j["state"], 0) + 1
            latencies.sort()
            q = lambda f: round(1000 * latencies[min(len(latencies) - 1, int(f * len(latencies)))], 1)
            every_client = sum(1 for d in seen if set(ids) <= d)
            print(json.dumps({
                "jobs": a.jobs * a.rounds, "clients": a.clients, "listed": len(jobs), "distinct_ids": len(set(ids)),
                "states": states, "clients_saw_every_done": every_client,
                "submit_ms_p50": q(0.5), "submit_ms_p99": q(0.99), "seconds": round(elapsed, 1),
                "peak_rss_MiB": s.peak_rss_mib(), "rss_after_each_round_MiB": rss,
                "prefix_cache_ram_after_each_round_MiB": prefix,
            }))
            stop.set()
            total = a.jobs * a.rounds
            ok = (len(jobs) == total and states.get("done") == total and every_client == a.clients)
            return 0 if ok else 1
        finally:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
