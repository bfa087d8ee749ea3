#!/usr/bin/env bash
# Set up (venv, deps, fresh build of the C extension) and run the demo:
# the C runtime on and off, side by side. Extra arguments go to examples/demo.py,
# e.g. `bash scripts/demo.sh --backend inductor`.
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

run_py examples/demo.py "$@"
