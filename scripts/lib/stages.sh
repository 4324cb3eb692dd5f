# Times the stages of a script and prints their wall times, with the total, when the
# outermost script that sourced this file exits (also on failure: the stage that failed is
# named). Sourced by .ci/run and scripts/test.sh; a nested script adds its rows to the
# outer one's table (through STRATA_STAGE_LOG) instead of printing its own.
#
#   source scripts/lib/stages.sh
#   stage "cargo test" cargo test --workspace

if [ -z "${STRATA_STAGE_LOG:-}" ]; then
    STRATA_STAGE_LOG="$(mktemp -t strata-stages.XXXXXX)"
    export STRATA_STAGE_LOG
    stages_t0=$SECONDS
    stages_report() {
        local rc=$?
        {
            echo "--- stage times (wall) ---"
            cat "$STRATA_STAGE_LOG"
            printf '%-44s %6ss\n' "total" "$((SECONDS - stages_t0))"
        } >&2
        rm -f "$STRATA_STAGE_LOG"
        return "$rc"
    }
    trap stages_report EXIT
fi

# stage NAME COMMAND...: runs COMMAND, recording NAME and its wall time (or its failure).
stage() {
    local name=$1 t0=$SECONDS rc=0
    shift
    echo "=== stage: $name" >&2
    "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        printf '%-44s %6ss\n' "$name" "$((SECONDS - t0))" >>"$STRATA_STAGE_LOG"
    else
        printf '%-44s %6ss  FAILED (exit %s)\n' "$name" "$((SECONDS - t0))" "$rc" >>"$STRATA_STAGE_LOG"
    fi
    return "$rc"
}
