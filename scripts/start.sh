#!/usr/bin/env bash
# Installs Longhaul (scripts/install.sh: under ~/.local, or $LONGHAUL_PREFIX)
# and runs `longhaul demo`: the small trained MoE model packed over four
# folders acting as drives, a task through the job queue, the answer as it
# is written and the job's statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
LONGHAUL="${LONGHAUL_PREFIX:-$HOME/.local}/bin/longhaul"
echo "== longhaul demo (the binary is $LONGHAUL)"
"$LONGHAUL" demo "$@"
