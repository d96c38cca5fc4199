#!/usr/bin/env bash
# `make e2e`: the e2e and fault tests on hp's default Slurm release (E2E_WORKERS xdist workers),
# and, beside them, the tests marked `releases` (each feature's) on every other release
# (HP_TEST_SLURM; OTHER_WORKERS workers); then the `serial` tests alone (the engine restart
# disturbs every other test). Each other release's log is printed after the main run's.
# Exit: non-zero when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
E2E_WORKERS=${E2E_WORKERS:-4}
OTHER_WORKERS=${OTHER_WORKERS:-2}
ARGS=${PYTEST_ARGS:-}
# the main run's release: HP_TEST_SLURM when set (tests/conftest.py), else hp's default
others=$($PY -c 'import os; from orchestrator.releases import DEFAULT, RELEASES
main = os.environ.get("HP_TEST_SLURM") or DEFAULT
print(*(r for r in RELEASES if r != main))')
declare -A pids logs
for r in $others; do
    logs[$r]=$(mktemp -t "hp-e2e-$r.XXXXXX")
    # shellcheck disable=SC2086
    HP_TEST_SLURM=$r $PY -m pytest tests/e2e -v -n "$OTHER_WORKERS" --dist loadgroup -m "releases and not serial" \
        -p no:cacheprovider $ARGS >"${logs[$r]}" 2>&1 &
    pids[$r]=$!
done
rc=0
# shellcheck disable=SC2086
$PY -m pytest tests/e2e tests/faults -v --durations=25 -n "$E2E_WORKERS" --dist loadgroup -m "not serial" $ARGS || rc=1
for r in $others; do
    wait "${pids[$r]}" || rc=1
    echo
    echo "==================== e2e tests marked 'releases' on Slurm $r (HP_TEST_SLURM=$r) ===================="
    cat "${logs[$r]}"
    rm -f "${logs[$r]}"
done
# shellcheck disable=SC2086
$PY -m pytest tests/e2e tests/faults -v -m serial $ARGS || rc=1
exit $rc
