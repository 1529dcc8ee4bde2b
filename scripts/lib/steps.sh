# Timed steps for scripts/test.sh and scripts/check.sh (sourced): `step LABEL COMMAND...` runs
# COMMAND and notes how long it took; the times are printed when the script ends, on a
# failure up to the step that failed.
TIMES=()
STARTED=$SECONDS
step() {
    local label=$1 began=$SECONDS
    shift
    "$@"
    TIMES+=("$(printf '%5d s  %s' $((SECONDS - began)) "$label")")
}
report_times() {
    local status=$?
    echo "--- time per step ---"
    for line in "${TIMES[@]}"; do echo "$line"; done
    [ "$status" -eq 0 ] || echo "  (a step failed after the ones above)"
    printf '%5d s  in all\n' $((SECONDS - STARTED))
}
trap report_times EXIT
