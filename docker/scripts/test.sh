#!/usr/bin/env bash
# The project's test command: pytest, then ruff and mypy when there is Python code in
# bundle/ or importer/. All stages run; exit status is non-zero if any failed.
# Extra arguments are passed to pytest.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

failed=()

# Every test's durations and a JUnit XML are kept as files in the run's folder
# ($SNEAKERNET_RUN/pytest: .ci/run copies them somewhere kept and prints where);
# stdout shows the 25 slowest, and the rest of pytest's output as it prints it.
reports="${SNEAKERNET_RUN:-/tmp/sneakernet-run}/pytest"
mkdir -p "$reports"
echo "== pytest (JUnit XML, log and every test's durations: $reports)"
rc=0
set +e
python3 -m pytest -q --durations=0 --junitxml="$reports/junit.xml" "$@" \
    | tee "$reports/pytest.log" \
    | awk -v keep=25 -v durations_file="$reports/durations.txt" '
        /^=+ slowest durations =+$/ { in_durations = 1; shown = 0; print; fflush(); next }
        in_durations && /^[0-9.]+s (setup|call|teardown) / {
            if (shown++ < keep) { print; fflush() }
            next
        }
        in_durations && /^\(.*durations.*hidden/ {
            print "(every duration: " durations_file ")"; fflush(); next
        }
        in_durations && /^=/ { in_durations = 0 }
        { print; fflush() }'
statuses=("${PIPESTATUS[@]}")
set -e
rc=${statuses[0]}
if [ "$rc" = 0 ] && { [ "${statuses[1]}" != 0 ] || [ "${statuses[2]}" != 0 ]; }; then
    rc=1  # pytest passed but its output was not all written
fi
grep -E '^[0-9.]+s (setup|call|teardown) ' "$reports/pytest.log" >"$reports/durations.txt" || true
case $rc in
0) ;;
5) echo "test.sh: pytest collected no tests (exit 5); treating as failure" >&2
   failed+=("pytest (no tests collected)") ;;
*) failed+=("pytest (exit $rc)") ;;
esac

has_python() { [ -d "$1" ] && [ -n "$(find "$1" -name '*.py' -print -quit)" ]; }

code_dirs=()
for d in bundle importer; do
    has_python "$d" && code_dirs+=("$d")
done

if [ ${#code_dirs[@]} -gt 0 ]; then
    echo "== ruff check ."
    python3 -m ruff check . || failed+=("ruff")
    echo "== mypy ${code_dirs[*]}"
    # Same as plain `mypy` (pyproject: files = bundle, importer) but without erroring
    # on a package dir that has no Python files yet.
    python3 -m mypy "${code_dirs[@]}" || failed+=("mypy")
else
    echo "== ruff/mypy skipped: no Python files in bundle/ or importer/"
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "test.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test.sh: all passed"
