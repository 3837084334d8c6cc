#!/usr/bin/env bash
# The project's test command: pytest, then ruff and mypy when there is Python code in
# bundle/ or importer/. All stages run; exit status is non-zero if any failed.
# Extra arguments are passed to pytest.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

failed=()

echo "== pytest"
rc=0
python3 -m pytest -q --durations=25 "$@" || rc=$?
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
