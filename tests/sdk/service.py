"""A `longhaul serve` on loopback for the SDK tests: a fresh data dir, the
address and token it writes there, and a stop that waits for it."""

import json
import os
import subprocess
import sys
import traceback
import tempfile
import time
import urllib.request
from pathlib import Path

START_SECONDS = 60
# Each produced piece of output waits this long, longer than the runner's
# 100 ms between progress events: a stream then gets the answer token by
# token, and a call's arguments in many fragments.
SLOW_FAULTS = "token-delay-ms=120"


class Service:
    def __init__(self, binary: Path, faults: str = ""):
        self.binary = binary
        self.env = dict(os.environ, LONGHAUL_FAULTS=faults) if faults else None
        self.tmp = tempfile.TemporaryDirectory(prefix="longhaul-sdk-")
        self.data = Path(self.tmp.name) / "data"

    def __enter__(self) -> "Service":
        self.data.mkdir()
        self.proc = subprocess.Popen([str(self.binary), "serve", "--port", "0", "--data-dir", str(self.data)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        endpoint = self.data / "endpoint"
        deadline = time.monotonic() + START_SECONDS
        while not (endpoint.exists() and endpoint.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"longhaul serve did not start (exit {self.proc.poll()})")
            time.sleep(0.02)
        self.url = endpoint.read_text().strip()
        self.token = (self.data / "token").read_text().strip()
        return self

    def add_model(self, name: str, path: Path) -> None:
        body = json.dumps({"name": name, "path": str(path)}).encode()
        request = urllib.request.Request(f"{self.url}/api/models", data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=START_SECONDS) as r:
            assert r.status in (200, 201), r.status

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=START_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.tmp.cleanup()


def run_checks(sdk: str, client, checks: list) -> int:
    """Runs each check (a function of `client`, or a pair of a function and
    the client it takes), printing `ok N` or `not ok N` with the traceback,
    then `# pass` and `# fail` totals; 1 if any failed."""
    failed = 0
    for n, item in enumerate(checks, 1):
        check, on = item if isinstance(item, tuple) else (item, client)
        try:
            check(on)
            print(f"ok {n} - {sdk}: {check.__name__}")
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            failed += 1
            print(f"not ok {n} - {sdk}: {check.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"# pass {len(checks) - failed}")
    print(f"# fail {failed}")
    return 1 if failed else 0
