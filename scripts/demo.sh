#!/usr/bin/env bash
# Set up (venv, deps, fresh build of the C extension) and run the demo:
# the C runtime on and off, side by side. Extra arguments go to examples/demo.py,
# e.g. `bash scripts/demo.sh --backend inductor`. Runs on the first release of
# TORCH_RELEASES (scripts/setup_env.sh) unless TORCH_AOT_RT_TORCH names another,
# e.g. `TORCH_AOT_RT_TORCH=2.14.1 bash scripts/demo.sh`.
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

setup_torch_env "${TORCH_AOT_RT_TORCH:-${TORCH_RELEASES[0]}}"
run_py examples/demo.py "$@"
