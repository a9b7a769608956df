#!/usr/bin/env bash
# Runs every Longhaul check: formatting, lints and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
longhaul_setup

echo "== format"
cargo fmt --all --check
echo "== lints"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked --all-targets 2>&1 | tee "$log"
# One closing line for the whole run: the sum over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
