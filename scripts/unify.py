#!/usr/bin/env python3
"""Checks that each part of the workspace the scripts build alone resolves
its dependencies as the whole workspace does.

`scripts/start.sh` builds `longhaul-service` alone; `scripts/test.sh` builds
the workspace, whose desktop shell (Tauri) and tests turn on more features of
shared crates (serde_json's `unbounded_depth`, proc-macro2's
`span-locations`, ...). A crate built with other features is another crate to
Cargo, and everything above it is rebuilt: before `unify/` existed, the
second command rebuilt nearly every crate the first had built. `unify/`
(written by `cargo hakari generate`, see .config/hakari.toml) turns those
features on for every member; this check fails, naming the crates, when a
dependency change has made it stale.

    python3 scripts/unify.py --check
"""

import subprocess
import sys

# The cargo calls of scripts/start.sh and scripts/test.sh that build a part of
# the workspace, and the dependency kinds each builds.
SELECTIONS = {
    "start.sh's build of the service": ["-p", "longhaul-service", "-e", "normal,build"],
    "test.sh's engine tests": ["-p", "longhaul-engine"],
    "test.sh's other tests": ["-p", "longhaul-service", "-p", "longhaul-desktop", "-p", "longhaul-e2e"],
}


def resolved(*selection: str) -> set[tuple[str, str]]:
    """(crate and version, features) of every third-party node `cargo tree`
    resolves for `selection`, build scripts' and proc macros' included."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", *selection, "--prefix", "none", "--format", "{p}|{f}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    nodes = set()
    for line in out.splitlines():
        package, _, features = line.removesuffix(" (*)").partition("|")
        package = package.strip()
        if not package or "(/" in package:
            continue  # a workspace member: its own features differ by design (`internals`)
        nodes.add((package.replace(" (proc-macro)", ""), features.strip()))
    return nodes


def main() -> int:
    if sys.argv[1:] != ["--check"]:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    together = resolved("--workspace")
    failed = False
    for name, selection in SELECTIONS.items():
        alone = resolved(*selection)
        stale = sorted(alone - together)
        if not stale:
            print(f"{name}: its {len(alone)} crates resolve as the workspace's")
            continue
        failed = True
        print(
            f"{name}: {len(stale)} crates resolve with other features than in the workspace, "
            "so they would be built twice. Run `cargo hakari generate` "
            "(cargo install cargo-hakari) and commit unify/:",
            file=sys.stderr,
        )
        for package, features in stale:
            print(f"  {package}: [{features}]", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
