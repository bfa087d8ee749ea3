# shellcheck shell=bash
# Shared set-up, sourced by scripts/test.sh and scripts/demo.sh (not meant to be run alone).
#
# Defines TORCH_RELEASES (the torch releases CI tests, one virtual environment each)
# and `setup_torch_env VERSION`, which on a fresh machine creates .venv-X.Y, installs
# torch==VERSION and the test tools into it and builds the C extension there. When the
# venv is already set up it only rebuilds the extension (a few seconds), so csrc/
# changes are always picked up.
#
# After setup_torch_env: $ROOT (repo root, also the cwd), $PY (that venv's python)
# and the function `run_py ARGS...`, which runs $PY with the sanitizer runtime
# preloaded when TORCH_AOT_RT_SANITIZE=1.
#
# Environment knobs:
#   PYTHON=python3.11        interpreter used to create the venvs (default: python3)
#   TORCH_AOT_RT_DEBUG=1     -O0 -g build with asserts         (read by setup.py)
#   TORCH_AOT_RT_SANITIZE=1  ASan/UBSan build                  (read by setup.py)
#
# Never let pip pull another torch (a CUDA build is several GB): torch is pinned per
# venv and only installed when the venv lacks that release in any build; the package
# itself is installed with --no-build-isolation --no-deps, so its build never
# resolves torch. torch==2.14.1 here is a local CUDA build of about 5.5 GB that runs
# on the CPU; torch==2.13.0 a CPU build.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The releases the suite runs on; keep in step with torch_aot_rt/_versions.py.
TORCH_RELEASES=(2.13.0 2.14.1)

_log() { printf '[setup] %s\n' "$*" >&2; }

setup_torch_env() {
    local version="$1"
    VENV="$ROOT/.venv-${version%.*}"
    PY="$VENV/bin/python"
    TORCH_SPEC="torch==$version"

    # 1. virtual environment
    if [ ! -x "$PY" ]; then
        _log "creating $VENV with ${PYTHON:-python3}"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi

    # 2. dependencies, skipped when already satisfied (checked locally: no pip, no network).
    #    setuptools>=70.1 builds PEP 660 editable wheels without the separate `wheel` package.
    local missing
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
# Any build of the release counts (2.13.0+cpu, 2.14.1+cu130, a GPU machine's own).
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
        _log "installing into $VENV: $missing"
        # $missing is a space-separated list of requirement specs; split on purpose.
        # The local index prints one "Location ... is ignored" line per package: noise.
        # shellcheck disable=SC2086
        "$PY" -m pip install --disable-pip-version-check -q $missing 2>&1 \
            | { grep -v "^WARNING: Location '.*' is ignored" || true; }
        "$PY" -c "import torch" # fail here, not in the tests, if the install did not take
    fi

    # 3. the extension: always rebuilt (setuptools builds editable wheels in a fresh temp dir).
    _log "building torch_aot_rt against $("$PY" -c 'import torch; print(torch.__version__)')" \
        "(debug=${TORCH_AOT_RT_DEBUG:-0} sanitize=${TORCH_AOT_RT_SANITIZE:-0})"
    "$PY" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps -e .
}

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
