#!/usr/bin/env bash
# Times the phases of a script: `phase NAME` ends the running phase and
# starts the next, `phase_end` ends the last, and `phases_report` prints each
# phase's minutes and seconds and the total (scripts/test.sh calls it on exit,
# so a failed run shows where its time went too). Sourced by the scripts.

LONGHAUL_PHASES=()
LONGHAUL_PHASE_NAME=""
LONGHAUL_PHASE_START=0
LONGHAUL_PHASES_START=$SECONDS

phase_end() {
    if [[ -n "$LONGHAUL_PHASE_NAME" ]]; then
        LONGHAUL_PHASES+=("$LONGHAUL_PHASE_NAME|$((SECONDS - LONGHAUL_PHASE_START))")
        LONGHAUL_PHASE_NAME=""
    fi
}

phase() {
    phase_end
    LONGHAUL_PHASE_NAME="$1"
    LONGHAUL_PHASE_START=$SECONDS
    echo "== $1"
}

phases_report() {
    phase_end
    local entry name secs
    echo "== time by phase"
    for entry in "${LONGHAUL_PHASES[@]}"; do
        name="${entry%|*}"
        secs="${entry##*|}"
        printf '  %-20s %3dm %02ds\n' "$name" $((secs / 60)) $((secs % 60))
    done
    secs=$((SECONDS - LONGHAUL_PHASES_START))
    printf '  %-20s %3dm %02ds\n' "total" $((secs / 60)) $((secs % 60))
}
