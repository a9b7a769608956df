#!/usr/bin/env bash
# Builds Longhaul and runs it on the small model kept in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
longhaul_setup
longhaul_build_ui

cargo build --release --locked -p longhaul-service
LONGHAUL="$CARGO_TARGET_DIR/release/longhaul"
MODEL=engine/tests/fixtures/deepseek_v3_released
echo "== longhaul run --model $MODEL (random weights: the text is noise, the pipeline is real)"
"$LONGHAUL" run --model "$MODEL" --prompt "Audit the storage engine and" --max-tokens 48
