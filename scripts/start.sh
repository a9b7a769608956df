#!/usr/bin/env bash
# Builds Longhaul and runs `longhaul demo`: the small trained MoE model in
# assets/ packed over four folders acting as drives, a task through the job
# queue, the answer as it is written and the job's statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
longhaul_setup
longhaul_build_ui

cargo build --release --locked -p longhaul-service
LONGHAUL="$CARGO_TARGET_DIR/release/longhaul"
echo "== longhaul demo (the binary is $LONGHAUL)"
"$LONGHAUL" demo "$@"
