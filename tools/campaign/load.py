#!/usr/bin/env python3
"""Load on a `longhaul serve`: N jobs submitted while M clients follow
/api/events. Reports submit latency (p50/p99), whether every job ended
done exactly once, whether every event client saw every job's `done`, and
the service's peak RSS. Standard library only; loopback only.

    python3 tools/campaign/load.py PATH/TO/longhaul MODEL_DIR [--jobs 1000] [--clients 50]
"""

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def request(url, token, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}{path}", data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def follow(url, token, seen, stop):
    host = url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=600)
    conn.request("GET", "/api/events", headers={"Authorization": f"Bearer {token}"})
    resp = conn.getresponse()
    event = None
    while not stop.is_set():
        line = resp.readline()
        if not line:
            return
        line = line.decode().rstrip("\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event == "job":
            job = json.loads(line[5:])
            if job.get("state") == "done":
                seen.add(job["id"])


def peak_rss_kib(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc = subprocess.Popen([a.binary, "serve", "--port", "0", "--data-dir", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            endpoint = data / "endpoint"
            while not (endpoint.exists() and endpoint.read_text().strip()):
                time.sleep(0.05)
            url, token = endpoint.read_text().strip(), (data / "token").read_text().strip()
            request(url, token, "POST", "/api/models", {"name": "m", "path": a.model})
            stop = threading.Event()
            seen = [set() for _ in range(a.clients)]
            followers = [threading.Thread(target=follow, args=(url, token, s, stop), daemon=True) for s in seen]
            for f in followers:
                f.start()
            time.sleep(1)
            latencies, ids = [], []
            started = time.monotonic()
            for i in range(a.jobs):
                t = time.monotonic()
                job = request(url, token, "POST", "/api/jobs",
                              {"model": "m", "prompt": f"task {i}", "max_tokens": 4})
                latencies.append(time.monotonic() - t)
                ids.append(job["id"])
            while True:
                jobs = request(url, token, "GET", "/api/jobs")["jobs"]
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
            every_client = sum(1 for s in seen if set(ids) <= s)
            print(json.dumps({
                "jobs": a.jobs, "clients": a.clients, "listed": len(jobs), "distinct_ids": len(set(ids)),
                "states": states, "clients_saw_every_done": every_client,
                "submit_ms_p50": q(0.5), "submit_ms_p99": q(0.99), "seconds": round(elapsed, 1),
                "peak_rss_MiB": round((peak_rss_kib(proc.pid) or 0) / 1024, 1),
            }))
            stop.set()
            ok = (len(jobs) == a.jobs and states.get("done") == a.jobs and every_client == a.clients)
            return 0 if ok else 1
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
