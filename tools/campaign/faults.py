#!/usr/bin/env python3
"""Drive faults during a job on a `longhaul serve` streaming a packed model
(`--budget 0`, so every expert is read from the drives): an I/O error,
a missing drive, an unreadable drive, truncated extent files, and a slow
drive. Each fault comes once the job is writing; the tool measures how
long the job takes to pause and what it says, repairs the fault, measures
how long the job takes to resume by itself (no one presses Resume), and
compares its text with an uninterrupted run. A slow drive must
not pause the job, only slow it. Standard library only; loopback only.

    python3 tools/campaign/faults.py PATH/TO/longhaul MODEL_DIR [--rounds 3]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import Service, pack

BODY = {"model": "packed", "prompt": "Audit the storage layer", "max_tokens": 60,
        "temperature": 0.8, "seed": 9}
ENDED = ("done", "failed", "cancelled")


def eio(ctx):
    ctx["eio"].write_text("")
    return lambda: ctx["eio"].unlink()


def missing(ctx):
    drive = ctx["drives"][1]
    away = drive.with_name(drive.name + "-unplugged")
    drive.rename(away)
    return lambda: away.rename(drive)


def unreadable(ctx):
    """The drive's folder becomes a symbolic link to itself: present, but
    nothing in it can be opened (ELOOP)."""
    drive = ctx["drives"][1]
    away = drive.with_name(drive.name + "-away")
    drive.rename(away)
    os.symlink(drive.name, drive)

    def repair():
        drive.unlink()
        away.rename(drive)
    return repair


def truncated(ctx):
    saved = []
    for path in sorted((ctx["drives"][1] / "pack").glob("*.bin")):
        saved.append((path, path.read_bytes()))
        os.truncate(path, 0)

    def repair():
        for path, data in saved:
            path.write_bytes(data)
    return repair


FAULTS = {"eio": eio, "missing": missing, "unreadable": unreadable, "truncated": truncated}


def wait_writing(s, id):
    began = time.monotonic()
    while s.job(id)["tokens"] == 0:
        if time.monotonic() - began > 120:
            raise RuntimeError(f"job {id} never wrote")
        time.sleep(0.005)


def one(s, ctx, name, reference):
    id = s.request("POST", "/api/jobs", BODY)["id"]
    wait_writing(s, id)
    repair = FAULTS[name](ctx)
    at = time.monotonic()
    try:
        job = s.wait(id, ("paused",) + ENDED, limit=60, poll=0.005)
        to_pause = time.monotonic() - at
    finally:
        repair()
    if job["state"] != "paused":
        return {"fault": name, "state": job["state"], "error": job.get("error")}
    reason = job.get("pause_reason")
    repaired = time.monotonic()
    # No one presses Resume: the job retries by itself once its drive reads.
    back = s.wait(id, ("running",) + ENDED, limit=600, poll=0.02)
    back_after = time.monotonic() - repaired
    done = s.wait(id, ENDED, limit=600)
    return {"fault": name, "paused_after_s": round(to_pause, 3), "reason": reason,
            "back_by_itself_after_s": round(back_after, 2) if back["state"] != "failed" else None,
            "state": done["state"], "identical": done["output"] == reference}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="longhaul-faults-"))
    try:
        packed, drives = pack(a.binary, a.model, root)
        ctx = {"drives": drives, "eio": root / "eio"}
        s = Service(a.binary, root / "data", ["--budget", "0"],
                    faults=f"store-eio-while={ctx['eio']},token-delay-ms=20")
        rows = []
        try:
            s.request("POST", "/api/models", {"name": "packed", "path": str(packed)})
            first = s.request("POST", "/api/jobs", BODY)["id"]
            reference = s.wait(first, ENDED, limit=300)
            plain_s = reference["stats"]["wall_seconds"]
            reference = reference["output"]
            for _ in range(a.rounds):
                for name in FAULTS:
                    rows.append(one(s, ctx, name, reference))
        finally:
            s.stop()
        slow = Service(a.binary, root / "data-slow", ["--budget", "0"],
                       faults="store-delay-ms=5,token-delay-ms=20")
        try:
            slow.request("POST", "/api/models", {"name": "packed", "path": str(packed)})
            id = slow.request("POST", "/api/jobs", BODY)["id"]
            states = set()
            began = time.monotonic()
            while True:
                job = slow.job(id)
                states.add(job["state"])
                if job["state"] in ENDED or time.monotonic() - began > 600:
                    break
                time.sleep(0.02)
            rows.append({"fault": "slow (5 ms per read)", "states_seen": sorted(states),
                         "state": job["state"], "identical": job["output"] == reference,
                         "seconds": job["stats"]["wall_seconds"], "unfaulted_seconds": plain_s})
        finally:
            slow.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for name in FAULTS:
        mine = [r for r in rows if r["fault"] == name]
        times = [r["paused_after_s"] for r in mine if "paused_after_s" in r]
        summary[name] = {
            "runs": len(mine), "paused": len(times),
            "identical_on_resume": sum(1 for r in mine if r.get("identical")),
            "pause_s_median": round(statistics.median(times), 3) if times else None,
            "pause_s_max": max(times) if times else None,
            "back_by_itself_s_max": max((r.get("back_by_itself_after_s") or 0 for r in mine), default=None),
            "reason": next((r.get("reason") for r in mine if r.get("reason")), None),
        }
    print(json.dumps({"summary": summary, "slow": rows[-1]}, indent=1))
    ok = all(s["paused"] == s["runs"] == s["identical_on_resume"] and s["pause_s_max"] < 1.0
             for s in summary.values())
    ok = ok and rows[-1]["state"] == "done" and rows[-1]["identical"] and "paused" not in rows[-1]["states_seen"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
