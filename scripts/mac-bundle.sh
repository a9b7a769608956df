#!/usr/bin/env bash
# Builds Longhaul.app (and a .dmg) for Apple Silicon, on a Mac: the web UI,
# the `longhaul` service, then Tauri's bundle with the service beside the
# menu-bar shell (Contents/MacOS/longhaul, where the shell looks for it).
#
# Needs macOS 11 or later with Xcode's command-line tools, Rust (rustup),
# Node.js 20 or later and Tauri's CLI (`cargo install tauri-cli --version "^2"`).
# Signing and notarisation follow Tauri's variables when they are set:
# APPLE_SIGNING_IDENTITY ("Developer ID Application: NAME (TEAM)"), and for
# notarisation APPLE_ID, APPLE_PASSWORD (an app-specific password) and
# APPLE_TEAM_ID; without them the app is built unsigned.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(uname -s)" != Darwin ]]; then
    echo "error: the app bundle is built on a Mac: it links against macOS's frameworks" >&2
    exit 1
fi
source scripts/setup.sh
target=aarch64-apple-darwin
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/longhaul/target}"
rustup target add "$target"
longhaul_build_ui
cargo build --release --locked --target "$target" -p longhaul-service
mkdir -p src-tauri/binaries
cp "$CARGO_TARGET_DIR/$target/release/longhaul" "src-tauri/binaries/longhaul-$target"
(cd src-tauri && cargo tauri build --target "$target" --config tauri.bundle.conf.json)
echo "== built $CARGO_TARGET_DIR/$target/release/bundle/macos/Longhaul.app"
