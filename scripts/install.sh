#!/usr/bin/env bash
# Builds Longhaul and installs it under a prefix (default ~/.local):
#   bin/longhaul                          the binary
#   lib/longhaul/ui/                      the web UI `longhaul serve` serves
#   lib/longhaul/assets/longhaul-demo-*   the demo model and its draft
# The binary finds its files there, relative to itself, so the source
# checkout can be moved or deleted afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${LONGHAUL_PREFIX:-$HOME/.local}"
source scripts/setup.sh
source scripts/phases.sh
trap phases_report EXIT
phase "system packages"
longhaul_setup
phase "web UI"
longhaul_build_ui
phase "build"
# The release profile, which scripts/test.sh builds in too.
cargo build --release --locked -p longhaul-service
phase "install"
lib="$PREFIX/lib/longhaul"
mkdir -p "$PREFIX/bin" "$lib/assets"
install -m 0755 "$CARGO_TARGET_DIR/release/longhaul" "$PREFIX/bin/longhaul"
rm -rf "$lib/ui" && cp -R ui/dist "$lib/ui"
for model in longhaul-demo-moe longhaul-demo-draft; do
  rm -rf "$lib/assets/$model" && cp -R "assets/$model" "$lib/assets/$model"
done
echo "== installed $PREFIX/bin/longhaul (web UI and demo model in $lib)"
