#!/usr/bin/env bash
# Set up and run the test suite on every torch release in TORCH_RELEASES
# (scripts/setup_env.sh), each in its own venv (.venv-2.13, .venv-2.14), each with a
# fresh build of the C extension.
#   bash scripts/test.sh                          # everything, every release
#   bash scripts/test.sh -k mutation -x           # extra arguments go to pytest
#   TORCH_AOT_RT_TORCH=2.14.1 bash scripts/test.sh  # one release only
# On each release the suite runs twice: with the C++ part (csrc/cpp/, built for that
# torch) and with the C core alone (TORCH_AOT_RT_CPP=0). Setting TORCH_AOT_RT_CPP
# (1 or 0) runs only that configuration.
# Exit status: 0 when every release passed, else the first failing pytest status.
# A run that executes no test is a failure (exit 5), including "nothing collected"
# and "everything skipped/deselected".
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

if [ ! -d tests ]; then
    echo "test.sh: no tests/ directory: failing" >&2
    exit 5
fi

if [ -n "${TORCH_AOT_RT_TORCH:-}" ]; then
    releases=("$TORCH_AOT_RT_TORCH")
else
    releases=("${TORCH_RELEASES[@]}")
fi

if [ -n "${TORCH_AOT_RT_CPP:-}" ]; then
    cpp_configs=("$TORCH_AOT_RT_CPP")
else
    cpp_configs=(1 0)
fi

status=0
summary=()
for version in "${releases[@]}"; do
    setup_torch_env "$version"
    for cpp in "${cpp_configs[@]}"; do
        if [ "$cpp" = "0" ]; then label="torch $version, C core alone (TORCH_AOT_RT_CPP=0)"
        else label="torch $version, with the C++ part"; fi
        echo "=== $label ($VENV) ===" >&2
        rc=0
        TORCH_AOT_RT_CPP="$cpp" PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}" \
            run_py -m pytest -p pytest_require_tests tests -q "$@" </dev/null || rc=$?
        if [ "$rc" -eq 5 ]; then
            echo "test.sh: pytest ran no tests ($label, exit 5): counted as a failure" >&2
        fi
        summary+=("$label: exit $rc")
        if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$rc
        fi
    done
done
printf 'test.sh: %s\n' "${summary[@]}" >&2
exit "$status"
