"""What the campaign tools share: a `longhaul serve` in a scratch data dir,
JSON requests with the token, an /api/events follower and the service's
peak RSS. Standard library only; loopback only."""

import http.client
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class Service:
    """A `longhaul serve` on a free port, stopped with `stop()`."""

    def __init__(self, binary, data, args=(), faults=None):
        env = dict(os.environ)
        if faults:
            env["LONGHAUL_FAULTS"] = faults
        self.data = Path(data)
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", "--data-dir", str(data), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        endpoint = self.data / "endpoint"
        began = time.monotonic()
        while not (endpoint.exists() and endpoint.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() - began > 60:
                raise RuntimeError(f"serve did not start (exit {self.proc.poll()})")
            time.sleep(0.05)
        self.url = endpoint.read_text().strip()
        self.token = (self.data / "token").read_text().strip()

    def call(self, method, path, body=None, timeout=60):
        """(status, parsed body or None), HTTP errors included."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def request(self, method, path, body=None):
        """The parsed body of a request that must succeed."""
        status, parsed = self.call(method, path, body)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: {status} {parsed}")
        return parsed

    def job(self, id):
        return self.request("GET", f"/api/jobs/{id}")

    def wait(self, id, states, limit=600, poll=0.01):
        """The job once its state is one of `states`."""
        began = time.monotonic()
        while True:
            job = self.job(id)
            if job["state"] in states:
                return job
            if time.monotonic() - began > limit:
                raise RuntimeError(f"job {id} stayed {job['state']}")
            time.sleep(poll)

    def _status_mib(self, field):
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith(field):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            return None
        return None

    def peak_rss_mib(self):
        return self._status_mib("VmHWM:")

    def rss_mib(self):
        return self._status_mib("VmRSS:")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise RuntimeError("serve did not stop within 30 s of SIGTERM")


def follow(service, on_job, stop):
    """Reads /api/events, calling `on_job(data)` for each job event, until
    `stop` is set or the stream ends."""
    conn = http.client.HTTPConnection(service.url.removeprefix("http://"), timeout=600)
    conn.request("GET", "/api/events", headers={"Authorization": f"Bearer {service.token}"})
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
            on_job(json.loads(line[5:]))


def pack(binary, model, root, drives=2):
    """`model` packed over `drives` folders under `root`; returns (pack, drive folders)."""
    folders = [Path(root) / f"drive{i}" for i in range(drives)]
    for d in folders:
        d.mkdir(parents=True, exist_ok=True)
    out = Path(root) / "pack"
    subprocess.run([binary, "pack", str(model), "--out", str(out), "--drives",
                    ",".join(map(str, folders)), "--split-threshold", "4K"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out, folders
