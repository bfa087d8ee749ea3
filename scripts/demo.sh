#!/usr/bin/env bash
# Set up (venv, deps, fresh build of the C extension) and run the demo:
# the C runtime on and off, side by side. Extra arguments go to examples/demo.py,
# e.g. `bash scripts/demo.sh --backend inductor`. Runs in the first environment of
# ENVIRONMENTS (scripts/setup_env.sh: torch 2.13.0 on CPython 3.11) unless
# TORCH_AOT_RT_TORCH / TORCH_AOT_RT_PYTHON name another torch release or CPython,
# e.g. `TORCH_AOT_RT_TORCH=2.15.0 TORCH_AOT_RT_PYTHON=3.12 bash scripts/demo.sh`.
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

first="${ENVIRONMENTS[0]}"
setup_torch_env "${TORCH_AOT_RT_TORCH:-$(env_torch "$first")}" "${TORCH_AOT_RT_PYTHON:-$(env_python "$first")}"
run_py examples/demo.py "$@"
