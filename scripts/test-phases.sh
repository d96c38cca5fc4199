#!/usr/bin/env bash
# `make test`: every phase in order (venv, Docker engine, images, the other Slurm releases' images,
# lint, unit, e2e), each timed; it stops at the first that fails. At the end, also after a
# failure: each phase's time and result, then one closing line with the tests' counts summed
# over the pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
MAKE_CMD=${MAKE:-make}
LOG=$(mktemp -t hp-test-phases.XXXXXX)
declare -a ROWS=()
T0=$(date +%s)

summary() {
    local total=$(( $(date +%s) - T0 ))
    echo
    echo "==================== make test: time of each phase ===================="
    for r in "${ROWS[@]}"; do echo "$r"; done
    printf '  %-8s %5d s  (%d min %02d s)\n' "all" "$total" $((total / 60)) $((total % 60))
    # the pytest closing lines ("== 804 passed, 1 skipped in 38.10s ==") of every run, summed
    python3 - "$LOG" <<'PY'
import re, sys
tot = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
for line in open(sys.argv[1], errors="replace"):
    # with -v: "==== 68 passed, 1 skipped in 531.29s ====", with -q: "878 passed in 45.32s"
    if re.match(r"^(=+ )?\d+ (passed|failed|skipped|errors?|deselected)\b.* in [0-9.]+s\b", line):
        for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", line):
            tot["error" if k.startswith("error") else k] += int(n)
print(f"tests: {tot['passed']} passed, {tot['failed'] + tot['error']} failed, {tot['skipped']} skipped")
PY
    rm -f "$LOG"
}
trap summary EXIT

for phase in venv docker images images-all lint unit e2e; do
    t=$(date +%s)
    $MAKE_CMD --no-print-directory "$phase" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    d=$(( $(date +%s) - t ))
    ROWS+=("$(printf '  %-8s %5d s  %s' "$phase" "$d" "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")")")
    [ "$rc" = 0 ] || exit "$rc"
done
