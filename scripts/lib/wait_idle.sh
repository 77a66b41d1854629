# Sourced by the benchmark scripts: `building` tells whether a build or test
# run (cargo, rustc) shares the cores; `wait_idle` waits until none does, so
# that no run is timed beside one, and gives up after an hour.
building() { pgrep -x rustc >/dev/null || pgrep cargo >/dev/null; }
wait_idle() {
    local waited=0
    while building; do
        [ "$waited" -eq 0 ] && echo "== waiting: a build runs ($(pgrep -a cargo | head -1))" >&2
        [ "$waited" -ge 3600 ] && { echo "error: a build has run for an hour; stopping" >&2; exit 1; }
        sleep 10
        waited=$((waited + 10))
    done
}
