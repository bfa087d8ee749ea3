# shellcheck shell=bash
# Shared set-up, sourced by scripts/test.sh and scripts/demo.sh (not meant to be run alone).
#
# Defines ENVIRONMENTS (the (torch release, CPython) pairs the suite runs in, each
# with its configurations), `torch_env TORCH PYTHON` (sets VENV and PY for that
# environment, creates nothing) and `setup_torch_env TORCH PYTHON [CANARY]`, which on
# a fresh machine finds (or provisions: scripts/provision_python.sh) that CPython,
# creates .venv-X.Y-pyM.N with it, installs torch==TORCH and the test tools into it
# and builds the C extension there. When the venv is already set up it
# only rebuilds the extension (about 80 s with the C++ part on 2 cores, a few seconds
# for the C core alone), so csrc/ changes are always picked up.
#
# After setup_torch_env: $ROOT (repo root, also the cwd), $VENV, $PY (that venv's
# python) and the function `run_py ARGS...`, which runs $PY with the sanitizer
# runtime preloaded when TORCH_AOT_RT_SANITIZE=1.
#
# Environment knobs:
#   TORCH_AOT_RT_PYTHON_3_12=/path/to/python3.12   the interpreter of a minor version
#                            (scripts/provision_python.sh; likewise for the others)
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

# The environments the suite runs in, one virtual environment each
# (.venv-<torch X.Y>-py<M.N>), in the order they are set up: "TORCH PYTHON
# CONFIGURATION...", each configuration one run of the suite there: cpp (with
# the C++ part), c-core (the C core alone, TORCH_AOT_RT_CPP=0), canary (a torch
# release no entry of torch_aot_rt/_versions.py covers: installed and run as a
# user would, the suite checking that the package changes nothing). Every
# (torch, CPython) pair the gate verifies (Release.pythons) is covered:
# tests/gate/test_workflows.py checks that each CPython runs with the newest torch
# it is verified with, and each torch release with CPython 3.11. The C core alone
# runs on the newest release only: another run of the suite beside 15 others would
# take CI past an hour on 2 cores.
# shellcheck disable=SC2034  # read by the scripts that source this file
ENVIRONMENTS=(
    "2.13.0 3.11 cpp"
    "2.14.1 3.11 cpp"
    "2.15.0 3.11 cpp c-core"
    "2.15.0 3.12 cpp"
    "2.12.1 3.11 cpp"
    "2.15.0 3.13 cpp"
    "2.11.0 3.11 cpp"
    "2.15.0 3.14 cpp"
    "2.14.1 3.10 cpp"
    "2.15.0 3.15 cpp"
    "2.10.0 3.11 canary"
)

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

# every_verified_pair: one ENVIRONMENTS-style entry ("TORCH PYTHON cpp") per (torch
# release, CPython) pair the gate verifies (torch_aot_rt/_versions.py, read by path:
# importing the package would install it), each release at ENVIRONMENTS' version of
# it. What `TORCH_AOT_RT_PAIRS=all bash scripts/test.sh` runs: every pair, not only
# those CI keeps covering.
every_verified_pair() {
    python3 - "${ENVIRONMENTS[@]}" <<'EOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("_rt_versions", "torch_aot_rt/_versions.py")
versions = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = versions
spec.loader.exec_module(versions)
exact = {".".join(e.split()[0].split(".")[:2]): e.split()[0]
         for e in sys.argv[1:] if "canary" not in e.split()}
for release in versions.VERIFIED:
    for python in release.pythons:
        print(f"{exact[release.name]} {versions.python_name(python)} cpp")
EOF
}

# env_torch / env_python / env_configs ENTRY: the fields of an ENVIRONMENTS entry.
env_torch() { local -a f; read -ra f <<<"$1"; echo "${f[0]}"; }
env_python() { local -a f; read -ra f <<<"$1"; echo "${f[1]}"; }
env_configs() { local -a f; read -ra f <<<"$1"; echo "${f[@]:2}"; }

# env_name TORCH PYTHON: the environment's name, as in its venv (2.15-py3.12).
env_name() { echo "${1%.*}-py$2"; }

# VENV and PY for an environment (TORCH PYTHON: .venv-X.Y-pyM.N); creates nothing.
torch_env() {
    VENV="$ROOT/.venv-$(env_name "$1" "$2")"
    PY="$VENV/bin/python"
}

# python_for MINOR: an interpreter of that CPython minor version, found or
# provisioned by scripts/provision_python.sh (which says why on failure).
python_for() { bash "$ROOT/scripts/provision_python.sh" "$1"; }

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
free_gb() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; } # PATH: GB free there

_require_free_space() {
    case " $1 " in *" torch=="*) ;; *) return 0 ;; esac
    local need_gb=10 free
    free=$(free_gb "$ROOT")
    if [ "$free" -lt "$need_gb" ]; then
        _log "only $free GB free on the disk holding $ROOT; installing torch into $VENV needs about $need_gb GB (a CUDA build's venv plus pip's cache). Free some space and rerun."
        return 1
    fi
}

# setup_torch_env TORCH PYTHON [CANARY]: the environment's venv, set up (CANARY
# non-empty: the package is built as a user would, whatever TORCH_AOT_RT_CPP says).
setup_torch_env() {
    local version="$1" python="$2" canary="${3:-}"
    torch_env "$version" "$python"
    TORCH_SPEC="torch==$version"

    # 1. virtual environment, with that CPython
    if [ ! -x "$PY" ]; then
        local interpreter
        interpreter="$(python_for "$python")"
        _log "creating $VENV with $interpreter"
        "$interpreter" -m venv "$VENV"
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
    #    the install must succeed. Otherwise the C++ part is built unless
    #    TORCH_AOT_RT_CPP=0 (the suite's c-core runs switch it off at run time).
    local cpp="${TORCH_AOT_RT_CPP:-}"
    if [ -n "$canary" ]; then cpp=""; fi
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
