#!/usr/bin/env bash
# Builds Longhaul and installs it under a prefix (default ~/.local):
#   bin/longhaul                          the binary
#   share/longhaul/ui/                    the web UI `longhaul serve` serves
#   share/longhaul/assets/longhaul-demo-* the demo model and its draft
# The binary finds its files there, relative to itself, so the source
# checkout can be moved or deleted afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${LONGHAUL_PREFIX:-$HOME/.local}"
source scripts/setup.sh
longhaul_setup
longhaul_build_ui

cargo build --release --locked -p longhaul-service
share="$PREFIX/share/longhaul"
mkdir -p "$PREFIX/bin" "$share/assets"
install -m 0755 "$CARGO_TARGET_DIR/release/longhaul" "$PREFIX/bin/longhaul"
rm -rf "$share/ui" && cp -R ui/dist "$share/ui"
for model in longhaul-demo-moe longhaul-demo-draft; do
  rm -rf "$share/assets/$model" && cp -R "assets/$model" "$share/assets/$model"
done
echo "== installed $PREFIX/bin/longhaul (web UI and demo model in $share)"
