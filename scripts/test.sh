#!/usr/bin/env bash
# Runs every Longhaul check: formatting, generated files, lints and all tests.
#
# Everything builds in the `release` profile, the one `scripts/start.sh`
# installs from, and every build resolves shared crates alike (see
# scripts/unify.py), so after `start.sh` this builds only the desktop
# shell's own dependencies, the engine with its tests' `internals` and the
# test harnesses. The time of each phase is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
source scripts/phases.sh
log="$(mktemp)"
trap 'rm -f "$log"; phases_report' EXIT

phase "system packages"
longhaul_setup
# The desktop shell (Tauri) builds against WebKitGTK; its smoke test runs it
# under Xvfb with a D-Bus session and takes a screenshot with ImageMagick; the
# browser tests drive Debian's Chromium.
longhaul_apt libwebkit2gtk-4.1-dev libayatana-appindicator3-dev librsvg2-dev libssl-dev libxdo-dev \
    xvfb dbus-daemon imagemagick chromium
phase "web UI"
longhaul_build_ui

phase "format"
cargo fmt --all --check
phase "generated files"
# Every build below and start.sh's resolve shared crates alike (unify/).
python3 scripts/unify.py --check
phase "lints"
cargo clippy --release --workspace --all-targets --locked -- -D warnings
phase "Mac cross-check"
# The workspace for Apple Silicon, its macOS code paths included,
# clippy-clean. Nothing is linked: there is no macOS SDK here, and for the
# same reason the desktop shell is checked without its notifications (see
# src-tauri/Cargo.toml). Libraries and binaries only: no test holds
# macOS-only code, and the engine's tests are built for aarch64 below.
longhaul_cross_tools
MAC=(--release --locked --target aarch64-apple-darwin)
cargo-zigbuild clippy "${MAC[@]}" --workspace --exclude longhaul-desktop -- -D warnings
cargo-zigbuild clippy "${MAC[@]}" -p longhaul-desktop --no-default-features -- -D warnings
phase "build"
# The binaries as start.sh builds them: without the engine's `internals`
# feature (its own tests turn it on), so this is also the check that the
# service and the desktop shell see only the engine's face (Engine, Session,
# settings, stats, tools). The end-to-end tests run these binaries, found
# beside their own (tests/tests/support).
cargo build --release --locked -p longhaul-service -p longhaul-desktop --bins
# The engine's tests open its internals; the other members' tests build
# against the engine as the binaries do, so they run in a second cargo call
# that reuses the binaries' crates.
ENGINE=(-p longhaul-engine)
OTHERS=(-p longhaul-service -p longhaul-desktop -p longhaul-e2e)
cargo test --release --locked --all-targets --no-run "${ENGINE[@]}"
cargo test --release --locked --all-targets --no-run "${OTHERS[@]}"
phase "tests"
status=0
for members in ENGINE OTHERS; do
    selection="$members[@]"
    cargo test --release --locked --all-targets --no-fail-fast "${!selection}" 2>&1 | tee -a "$log" || status=1
done
phase "aarch64 tests"
# The engine's unit tests (its kernels among them) and the reference logits
# on aarch64, the Mac's instruction set, under qemu: every fixture's logits
# must be the bits x86-64 computes (engine/tests/logit_bits.json).
longhaul_arm_tools
cargo-zigbuild test --release --locked --target aarch64-unknown-linux-gnu \
    -p longhaul-engine --lib --test reference_logits 2>&1 | tee -a "$log" || status=1
phase "browser tests"
# Against the binary the Rust tests just ran.
LONGHAUL_BIN="$CARGO_TARGET_DIR/release/longhaul" node --test tests/ui/ 2>&1 | tee -a "$log" || status=1
phase "SDK clients"
# OpenAI's and Anthropic's own Python libraries against the same binary, on loopback.
longhaul_sdk_venv
for t in tests/sdk/*_tools.py; do
    "$LONGHAUL_SDK_PYTHON" "$t" "$CARGO_TARGET_DIR/release/longhaul" 2>&1 | tee -a "$log" || status=1
done
phase_end
# One closing line for the whole run: the sum over every test binary, the browser and the SDK tests.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     /^# pass / { p += $3 } /^# fail / { f += $3 }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
