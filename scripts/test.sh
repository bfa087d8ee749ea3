#!/usr/bin/env bash
# Set up (venv, deps, fresh build of the C extension) and run the test suite.
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -k mutation -x  # extra arguments go to pytest
# Exit status: pytest's. A run that executes no test is a failure (exit 5), including
# "nothing collected" and "everything skipped/deselected".
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

if [ ! -d tests ]; then
    echo "test.sh: no tests/ directory: failing" >&2
    exit 5
fi

rc=0
PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}" \
    run_py -m pytest -p pytest_require_tests tests -q "$@" </dev/null || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest ran no tests (exit 5): counted as a failure" >&2
fi
exit "$rc"
