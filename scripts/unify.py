#!/usr/bin/env python3
"""Keeps every part of the workspace the scripts build resolving shared
dependencies alike, so that no crate is compiled twice.

`scripts/start.sh` builds `longhaul-service` alone; `scripts/test.sh` builds
the desktop shell with it, then the tests. The desktop shell's Tauri and
the tests turn on more features of shared crates (serde_json's
`unbounded_depth`, proc-macro2's `span-locations`, `default` of memchr and
quote in build scripts), and a crate built with other features is another
crate to Cargo, with everything above it: before `unify/` existed, the
second command rebuilt 372 of the 479 crates the first had built.

`unify/` is a crate every member depends on whose dependency list turns on,
for each crate of the service's build whose features differ between those
builds, all of them: as a dependency for the code's copy, as a build
dependency for the copy build scripts and proc macros use. The features
are read from the builds Cargo plans (`cargo build --unit-graph`, behind
`-Z unstable-options`, hence RUSTC_BOOTSTRAP; nothing is compiled).
cargo-hakari writes such crates too, but it does not tell a build script's
copy of a crate from the code's, and those were the copies that still
differed.

    python3 scripts/unify.py --check   fails, naming the crates, while a
                                       build would compile one twice
    python3 scripts/unify.py --write   rewrites unify/Cargo.toml
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "unify" / "Cargo.toml"
# The builds the scripts make, by the cargo arguments that select them.
BUILDS = {
    "start.sh's service": ["-p", "longhaul-service"],
    "test.sh's binaries": ["-p", "longhaul-service", "-p", "longhaul-desktop"],
    "test.sh's engine tests": ["-p", "longhaul-engine", "--all-targets"],
    "test.sh's other tests": [
        "-p", "longhaul-service", "-p", "longhaul-desktop", "-p", "longhaul-e2e", "--all-targets",
    ],
}
BASE = "start.sh's service"
# The scripts build on Linux; other platforms' builds are left as they are.
TABLES = {
    "target": "[target.'cfg(target_os = \"linux\")'.dependencies]",
    "host": "[target.'cfg(target_os = \"linux\")'.build-dependencies]",
}
HEADER = """# Written by scripts/unify.py --write; see that script for why this crate
# exists. Each line turns on, for a crate of the service's build, every
# feature any of the scripts' builds turns on: under [dependencies] for the
# code's copy, under [build-dependencies] for build scripts' and proc macros'.

[package]
name = "longhaul-unify"
description = "Every feature any Longhaul build turns on in a shared dependency, so that each build resolves them alike"
version.workspace = true
edition.workspace = true
license.workspace = true
publish = false
"""


def planned(selection: list[str]) -> dict[tuple[str, str, str], frozenset[str]]:
    """(crate, version, side) → features of every third-party library Cargo
    would compile for `selection`; side is `host` for build scripts, proc
    macros and what they use, else `target`."""
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    out = subprocess.run(
        ["cargo", "build", "--release", "--locked", "-Z", "unstable-options", "--unit-graph", *selection],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout
    units = json.loads(out)["units"]
    host = [False] * len(units)
    stack = [
        i for i, u in enumerate(units)
        if u["mode"] == "run-custom-build" or set(u["target"]["kind"]) & {"custom-build", "proc-macro"}
    ]
    while stack:
        i = stack.pop()
        if host[i]:
            continue
        host[i] = True
        stack.extend(d["index"] for d in units[i]["dependencies"])
    crates = {}
    for i, u in enumerate(units):
        source, _, name_version = u["pkg_id"].rpartition("#")
        library = set(u["target"]["kind"]) & {"lib", "rlib", "proc-macro"}
        if not source.startswith("registry+") or u["mode"] != "build" or not library:
            continue
        name, _, version = name_version.rpartition("@")
        key = (name, version, "host" if host[i] else "target")
        crates[key] = crates.get(key, frozenset()) | frozenset(u["features"])
    return crates


def differing(plans: dict[str, dict]) -> dict[tuple[str, str, str], frozenset[str]]:
    """The service's crates that some build resolves otherwise, with the
    union of their features over every build."""
    union = {}
    for key in plans[BASE]:
        seen = {plan[key] for plan in plans.values() if key in plan}
        if len(seen) > 1:
            union[key] = frozenset().union(*seen)
    return union


def write(union: dict[tuple[str, str, str], frozenset[str]]) -> None:
    names = {}
    for name, version, _ in union:
        names.setdefault(name, set()).add(version)
    sections = {"target": [], "host": []}
    for (name, version, side), features in sorted(union.items()):
        key = name if len(names[name]) == 1 else f"{name}-{version.split('.')[0]}"
        alias = "" if key == name else f'package = "{name}", '
        listed = ", ".join(f'"{f}"' for f in sorted(features - {"default"}))
        default = "" if "default" in features else "default-features = false, "
        sections[side].append(f'{key} = {{ {alias}version = "{version}", {default}features = [{listed}] }}')
    text = HEADER + f"\n{TABLES['target']}\n" + "\n".join(sections["target"])
    text += f"\n\n{TABLES['host']}\n" + "\n".join(sections["host"]) + "\n"
    MANIFEST.write_text(re.sub(r"features = \[\] ", "", text))


def main() -> int:
    if sys.argv[1:] not in (["--check"], ["--write"]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if sys.argv[1] == "--write":
        for _ in range(5):
            union = differing({name: planned(sel) for name, sel in BUILDS.items()})
            if not union:
                break
            current = MANIFEST.read_text()
            merged = parse_manifest(current)
            for key, features in union.items():
                merged[key] = merged.get(key, frozenset()) | features
            write(merged)
            subprocess.run(["cargo", "metadata", "--format-version", "1", "--offline"],
                           cwd=ROOT, check=True, capture_output=True)
            if MANIFEST.read_text() == current:
                break
    plans = {name: planned(sel) for name, sel in BUILDS.items()}
    union = differing(plans)
    if not union:
        print(f"the scripts' {len(BUILDS)} builds resolve the service's {len(plans[BASE])} crates alike")
        return 0
    print(
        f"{len(union)} crates of the service's build resolve otherwise in another of the scripts' "
        "builds, so they and all above them would be compiled twice; run "
        "`python3 scripts/unify.py --write` and commit unify/Cargo.toml:",
        file=sys.stderr,
    )
    for (name, version, side), features in sorted(union.items()):
        builds = [b for b, plan in plans.items() if plan.get((name, version, side)) not in (None, features)]
        print(f"  {name} {version} ({side}): not all of [{', '.join(sorted(features))}] in {', '.join(builds)}",
              file=sys.stderr)
    return 1


def parse_manifest(text: str) -> dict[tuple[str, str, str], frozenset[str]]:
    """The entries unify/Cargo.toml holds, as `write` takes them."""
    entries, side = {}, None
    for line in text.splitlines():
        if line.startswith("["):
            side = {table: side for side, table in TABLES.items()}.get(line.strip())
            continue
        m = re.match(r'^([\w-]+) = \{ (?:package = "([\w-]+)", )?version = "([^"]+)", (default-features = false, )?(?:features = \[([^\]]*)\] )?\}', line)
        if side and m:
            name = m.group(2) or m.group(1)
            features = set(re.findall(r'"([^"]+)"', m.group(5) or ""))
            if not m.group(4):
                features.add("default")
            entries[(name, m.group(3), side)] = frozenset(features)
    return entries


if __name__ == "__main__":
    sys.exit(main())
