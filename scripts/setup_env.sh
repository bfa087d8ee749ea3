# shellcheck shell=bash
# Shared set-up, sourced by scripts/test.sh and scripts/demo.sh (not meant to be run alone).
#
# Defines TORCH_RELEASES (the torch releases CI tests, one virtual environment each),
# CANARY_RELEASES (torch releases no entry of torch_aot_rt/_versions.py covers, on
# which the package must change nothing), `is_canary VERSION`, `torch_env VERSION`
# (sets VENV and PY for that release, creates nothing) and `setup_torch_env VERSION`,
# which on a fresh machine creates .venv-X.Y, installs torch==VERSION and the test
# tools into it and builds the C extension there. When the venv is already set up it
# only rebuilds the extension (about 80 s with the C++ part on 2 cores, a few seconds
# for the C core alone), so csrc/ changes are always picked up.
#
# After setup_torch_env: $ROOT (repo root, also the cwd), $VENV, $PY (that venv's
# python) and the function `run_py ARGS...`, which runs $PY with the sanitizer
# runtime preloaded when TORCH_AOT_RT_SANITIZE=1.
#
# Environment knobs:
#   PYTHON=python3.11        interpreter used to create the venvs (default: python3)
#   TORCH_AOT_RT_DEBUG=1     -O0 -g build with asserts         (read by setup.py)
#   TORCH_AOT_RT_SANITIZE=1  ASan/UBSan build                  (read by setup.py)
#
# Never let pip pull another torch (a CUDA build is several GB): torch is pinned per
# venv and only installed when the venv lacks that release in any build; the package
# itself is installed with --no-build-isolation --no-deps, so its build never
# resolves torch. Here torch==2.13.0 is a CPU build and torch==2.14.1 a CUDA build of
# about 5.5 GB (both lie on the project's machines as local files pip finds); 2.15.0,
# 2.12.1, 2.11.0 and the canary are CUDA builds from PyPI, about 5 to 7 GB per venv. All of
# them run on the CPU. A pip constraints file
# capping torch (a machine's pip configuration) is lifted for these installs
# (PIP_CONSTRAINT=/dev/null): the pin is the exact release.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The releases the suite runs on, and the canaries (releases no entry covers: the
# suite checks that the package changes nothing there); keep both in step with
# torch_aot_rt/_versions.py.
# shellcheck disable=SC2034  # read by the scripts that source this file
TORCH_RELEASES=(2.13.0 2.14.1 2.15.0 2.12.1 2.11.0)
CANARY_RELEASES=(2.10.0)
# The releases whose headers the C++ part is built against (torch_aot_rt/_cpp.py
# CPP_SERIES); on the other verified releases it is not built, and the suite's two
# configurations would be the same run: it runs once there.
# shellcheck disable=SC2034  # read by the scripts that source this file
CPP_RELEASES=(2.13.0 2.14.1 2.15.0 2.12.1 2.11.0)

_log() { printf '[setup] %s\n' "$*" >&2; }

# _in_list VALUE ITEM...: whether VALUE is one of the ITEMs
_in_list() {
    local value="$1" v
    shift
    for v in "$@"; do
        if [ "$v" = "$value" ]; then return 0; fi
    done
    return 1
}

has_cpp_part() { _in_list "$1" "${CPP_RELEASES[@]}"; }

is_canary() { _in_list "$1" "${CANARY_RELEASES[@]}"; }

# VENV and PY for a release (X.Y.Z -> .venv-X.Y); creates nothing.
torch_env() {
    VENV="$ROOT/.venv-${1%.*}"
    PY="$VENV/bin/python"
}

# pip install ARGS into $PY's venv, the constraints cap lifted, retried: pip retries
# a failed connection itself (--retries, --timeout for a stalled read); a download
# that still fails (a reset in the middle of a wheel of 1 GB) is started over, up to
# 3 times. What was downloaded whole stays in pip's cache and is not fetched again.
_pip_install() {
    local attempt rc
    for attempt in 1 2 3; do
        rc=0
        # The local index prints one "Location ... is ignored" line per package: noise.
        # --no-compile: no byte-compiling of the 6,000-odd .py files of a CUDA
        # torch and its packages at install (about 30 s of CPU each); Python
        # writes the .pyc of what is imported, atomically, on first import.
        PIP_CONSTRAINT=/dev/null "$PY" -m pip install --disable-pip-version-check -q \
            --no-compile --retries 10 --timeout 60 "$@" 2>&1 \
            | { grep -v "^WARNING: Location '.*' is ignored" || true; } || rc=$?
        if [ "$rc" -eq 0 ]; then return 0; fi
        if [ "$attempt" -lt 3 ]; then
            _log "pip install failed (exit $rc, attempt $attempt of 3): retrying in $((attempt * 15)) s"
            sleep $((attempt * 15))
        fi
    done
    _log "pip install failed 3 times (exit $rc): $*"
    return "$rc"
}

# A torch install needs room: a CUDA build's venv is 5 to 7 GB, and pip keeps the
# wheels in its cache as well. A full disk otherwise shows up as a broken download
# deep in pip ("Connection broken: OSError(28...)"); say so plainly, before pip.
_require_free_space() {
    case " $1 " in *" torch=="*) ;; *) return 0 ;; esac
    local need_gb=10 free_gb
    free_gb=$(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1048576) }')
    if [ "$free_gb" -lt "$need_gb" ]; then
        _log "only $free_gb GB free on the disk holding $ROOT; installing torch into $VENV needs about $need_gb GB (a CUDA build's venv plus pip's cache). Free some space and rerun."
        return 1
    fi
}

setup_torch_env() {
    local version="$1"
    torch_env "$version"
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
        _require_free_space "$missing"
        _log "installing into $VENV: $missing"
        local t0=$SECONDS
        # $missing is a space-separated list of requirement specs; split on purpose.
        # shellcheck disable=SC2086
        _pip_install $missing
        "$PY" -c "import torch" # fail here, not in the tests, if the install did not take
        _log "installed in $((SECONDS - t0)) s"
    fi

    # 3. the extension: always rebuilt (setuptools builds editable wheels in a fresh temp dir).
    #    A canary is built as a user would install it: setup.py itself skips the C++
    #    part on a torch whose headers it does not support (2.10's) and records why;
    #    the install must succeed.
    local cpp="${TORCH_AOT_RT_CPP:-}"
    if is_canary "$version"; then cpp=""; fi
    local -a build=("$PY" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps -e .)
    if [ -n "$cpp" ]; then build=(env TORCH_AOT_RT_CPP="$cpp" "${build[@]}"); fi
    _log "building torch_aot_rt against $("$PY" -c 'import torch; print(torch.__version__)')" \
        "(C++ part: $([ "$cpp" = 0 ] && echo no || echo "where setup.py supports this torch's headers")," \
        "debug=${TORCH_AOT_RT_DEBUG:-0} sanitize=${TORCH_AOT_RT_SANITIZE:-0})"
    local t0=$SECONDS
    "${build[@]}"
    _log "built in $((SECONDS - t0)) s"
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
