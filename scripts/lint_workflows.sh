#!/usr/bin/env bash
# Lint .github/workflows/*.yml: the GitHub workflow schema (check-jsonschema, its
# vendored schema) and zizmor's audits, both offline, from a tools venv
# (.venv-tools). actionlint is not used: its PyPI package downloads the binary
# from GitHub at install time. tests/gate/test_workflows.py checks, in the suite, that
# every job runs `bash .ci/run`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TOOLS="$ROOT/.venv-tools"
if [ ! -x "$TOOLS/bin/zizmor" ] || [ ! -x "$TOOLS/bin/check-jsonschema" ]; then
    "${PYTHON:-python3}" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q check-jsonschema zizmor
fi
"$TOOLS/bin/check-jsonschema" --builtin-schema vendor.github-workflows .github/workflows/*.yml
"$TOOLS/bin/zizmor" --offline .github/workflows/
