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
cargo test --workspace --locked
