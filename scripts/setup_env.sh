# shellcheck shell=bash
# Shared set-up, sourced by scripts/test.sh and scripts/demo.sh (not meant to be run alone).
#
# On a fresh machine: creates .venv, installs torch==2.13.0 and the test tools, and
# builds the C extension. When already set up it only rebuilds the extension (a few
# seconds), so csrc/ changes are always picked up.
#
# Afterwards: $ROOT (repo root, also the cwd), $PY (the venv's python) and the function
# `run_py ARGS...`, which runs $PY with the sanitizer runtime preloaded when
# TORCH_AOT_RT_SANITIZE=1.
#
# Environment knobs:
#   PYTHON=python3.11        interpreter used to create .venv (default: python3)
#   TORCH_AOT_RT_DEBUG=1     -O0 -g build with asserts         (read by setup.py)
#   TORCH_AOT_RT_SANITIZE=1  ASan/UBSan build                  (read by setup.py)
#
# Never let pip pull another torch (a CUDA build is several GB): torch is pinned here
# and only installed when the venv lacks torch 2.13.0 in any build; the package itself
# is installed with --no-build-isolation --no-deps, so its build never resolves torch.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH_SPEC="torch==2.13.0"

_log() { printf '[setup] %s\n' "$*" >&2; }

# 1. virtual environment
if [ ! -x "$PY" ]; then
    _log "creating $VENV with ${PYTHON:-python3}"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

# 2. dependencies, skipped when already satisfied (checked locally: no pip, no network).
#    setuptools>=70.1 builds PEP 660 editable wheels without the separate `wheel` package.
missing="$("$PY" - "$TORCH_SPEC" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version


def base(v):
    return tuple(int(x) for x in v.split("+")[0].split(".")[:3] if x.isdigit())


def have(dist):
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


missing = []
torch_spec = sys.argv[1]
tv = have("torch")
# Any build of 2.13.0 counts (2.13.0+cpu here, a CUDA build on a GPU machine).
if tv is None or base(tv) != base(torch_spec.split("==")[1]):
    missing.append(torch_spec)
for dist in ("pytest", "pytest-benchmark", "numpy"):
    if have(dist) is None:
        missing.append(dist)
sv = have("setuptools")
if sv is None or base(sv) < (70, 1):
    missing.append("setuptools>=70.1")
print(" ".join(missing))
EOF
)"
if [ -n "$missing" ]; then
    _log "installing: $missing"
    # $missing is a space-separated list of requirement specs; split on purpose.
    # shellcheck disable=SC2086
    "$PY" -m pip install --disable-pip-version-check -q $missing
fi

# 3. the extension: always rebuilt (setuptools builds editable wheels in a fresh temp dir).
_log "building torch_aot_rt (debug=${TORCH_AOT_RT_DEBUG:-0} sanitize=${TORCH_AOT_RT_SANITIZE:-0})"
"$PY" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps -e .

# 4. a sanitizer build needs its runtime loaded first into the (uninstrumented) python.
run_py() {
    if [ "${TORCH_AOT_RT_SANITIZE:-0}" = "1" ]; then
        # libstdc++ too: ASan intercepts __cxa_throw, and torch raises C++
        # exceptions (caught into Python errors) that it must find.
        local asan stdcxx
        asan="$("${CC:-gcc}" -print-file-name=libasan.so)"
        stdcxx="$("${CC:-gcc}" -print-file-name=libstdc++.so)"
        LD_PRELOAD="$asan:$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}" \
            ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" \
            UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
            "$PY" "$@"
    else
        "$PY" "$@"
    fi
}
