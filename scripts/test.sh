#!/usr/bin/env bash
# Runs every Longhaul check: formatting, lints and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
longhaul_setup
# The desktop shell (Tauri) builds against WebKitGTK; its smoke test runs it
# under Xvfb with a D-Bus session and takes a screenshot with ImageMagick; the
# browser tests drive Debian's Chromium.
longhaul_apt libwebkit2gtk-4.1-dev libayatana-appindicator3-dev librsvg2-dev libssl-dev libxdo-dev \
    xvfb dbus-daemon imagemagick chromium
longhaul_build_ui

echo "== format"
cargo fmt --all --check
echo "== lints"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== the engine's face"
# Without the engine's `internals` feature (its own tests turn it on), the
# service sees only Engine, Session, settings, stats and tools.
cargo check -p longhaul-service --lib --bins --locked
echo "== binaries"
# The end-to-end tests run the binaries beside their own (tests/support): cargo
# test builds a package's binaries only for that package's own tests, so the
# workspace's `longhaul` and `longhaul-desktop` are built here first.
cargo build --workspace --bins --locked
echo "== tests"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --all-targets --no-fail-fast 2>&1 | tee "$log" || status=1
echo "== browser tests"
# Against the debug binary the Rust tests just built.
LONGHAUL_BIN="$CARGO_TARGET_DIR/debug/longhaul" node --test tests/ui/ 2>&1 | tee -a "$log" || status=1
echo "== SDK clients"
# OpenAI's and Anthropic's own Python libraries against the same binary, on loopback.
longhaul_sdk_venv
for t in tests/sdk/*_tools.py; do
    "$LONGHAUL_SDK_PYTHON" "$t" "$CARGO_TARGET_DIR/debug/longhaul" 2>&1 | tee -a "$log" || status=1
done
# One closing line for the whole run: the sum over every test binary, the browser and the SDK tests.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     /^# pass / { p += $3 } /^# fail / { f += $3 }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
