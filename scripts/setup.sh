#!/usr/bin/env bash
# Installs what building Longhaul needs on a Debian or Ubuntu machine, and
# nothing that is already there. Sourced by the other scripts.
set -euo pipefail

# Debian packages the build needs (C compiler for the tokenizer's regex engine).
LONGHAUL_APT_PACKAGES=(build-essential pkg-config)

longhaul_setup() {
    local missing=()
    for pkg in "${LONGHAUL_APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        echo "installing Debian packages: ${missing[*]}"
        local sudo=""
        [[ $(id -u) -eq 0 ]] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
    fi
    if ! command -v cargo >/dev/null; then
        echo "error: Rust (cargo) is not installed; install the stable toolchain from rustup.rs and rerun" >&2
        exit 1
    fi
    # Builds are cached outside the clone so that a fresh clone reuses them.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/longhaul/target}"
    mkdir -p "$CARGO_TARGET_DIR"
}
