#!/usr/bin/env bash
# Installs what building Longhaul needs on a Debian or Ubuntu machine, and
# nothing that is already there. Sourced by the other scripts.
set -euo pipefail

# Debian packages the build needs (C compiler for the tokenizer's regex engine
# and SQLite).
LONGHAUL_APT_PACKAGES=(build-essential pkg-config)
# Node.js builds the web UI; Vite needs version 20 or later.
LONGHAUL_NODE_MAJOR=20

# Installs the given Debian packages that are not installed yet.
longhaul_apt() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        echo "installing Debian packages: ${missing[*]}"
        local sudo=""
        [[ $(id -u) -eq 0 ]] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
    fi
}

# Builds the web UI into ui/dist from the npm lock file.
longhaul_build_ui() {
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "error: Node.js $LONGHAUL_NODE_MAJOR or later (with npm) is needed to build the web UI; install it and rerun" >&2
        exit 1
    fi
    local major
    major="$(node -p 'process.versions.node.split(".")[0]')"
    if ((major < LONGHAUL_NODE_MAJOR)); then
        echo "error: Node.js $(node --version) is too old for the web UI's build; install $LONGHAUL_NODE_MAJOR or later" >&2
        exit 1
    fi
    (cd ui && npm ci --no-audit --no-fund --loglevel=error && npm run build --silent)
}

# The API's client libraries as users install them (openai and anthropic from
# PyPI, pinned in tests/sdk/requirements.txt), in a venv outside the clone, for
# the SDK tests; sets LONGHAUL_SDK_PYTHON.
longhaul_sdk_venv() {
    longhaul_apt python3-venv
    local venv="$HOME/.cache/longhaul/sdk-venv"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r tests/sdk/requirements.txt
    LONGHAUL_SDK_PYTHON="$venv/bin/python"
}

# What cross-checking the workspace for the Mac needs, from the registries
# a bare Debian machine reaches: Rust's standard library for Apple Silicon
# (rustup), and zig, whose C compiler carries macOS's libc headers for the
# dependencies' C parts, with cargo-zigbuild to drive cargo with it (both
# from PyPI, pinned in scripts/cross-requirements.txt, in a venv outside the
# clone). Puts cargo-zigbuild on PATH.
longhaul_cross_tools() {
    longhaul_apt python3-venv
    local venv="$HOME/.cache/longhaul/cross-venv"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r scripts/cross-requirements.txt
    rustup target add aarch64-apple-darwin 2>&1 | grep -v "is up to date" || true
    export PATH="$venv/bin:$PATH"
}

# What running the engine's tests on aarch64 needs: qemu's user-mode
# emulator and Debian's aarch64 C library to run them with, Rust's standard
# library for aarch64 Linux, and the cross tools above to link. Sets the
# runner cargo uses for that target.
longhaul_arm_tools() {
    longhaul_cross_tools
    longhaul_apt qemu-user libc6-arm64-cross
    rustup target add aarch64-unknown-linux-gnu 2>&1 | grep -v "is up to date" || true
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
}

longhaul_setup() {
    longhaul_apt "${LONGHAUL_APT_PACKAGES[@]}"
    if ! command -v cargo >/dev/null; then
        echo "error: Rust (cargo) is not installed; install the stable toolchain from rustup.rs and rerun" >&2
        exit 1
    fi
    # Builds are cached outside the clone so that a fresh clone reuses them.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/longhaul/target}"
    mkdir -p "$CARGO_TARGET_DIR"
}
