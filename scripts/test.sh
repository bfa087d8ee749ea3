#!/usr/bin/env bash
# Set up and run the test suite on every torch release in TORCH_RELEASES and on every
# canary in CANARY_RELEASES (scripts/setup_env.sh), each in its own venv (.venv-2.13,
# .venv-2.14, ...), each with a fresh build of the C extension.
#   bash scripts/test.sh                          # everything, every release and canary
#   bash scripts/test.sh -k mutation -x           # extra arguments go to pytest (every run)
#   bash scripts/test.sh tests/test_cpp.py -x      # test paths (tests/...) replace the default tests/
#   TORCH_AOT_RT_TORCH=2.14.1 bash scripts/test.sh  # one release (or canary) only
# On each release the suite runs twice: with the C++ part (csrc/cpp/, built for that
# torch) and with the C core alone (TORCH_AOT_RT_CPP=0); the tests marked
# cpp_independent (subprocess checks of the gate, build, loader and switches) run in
# the first only. Setting TORCH_AOT_RT_CPP
# (1 or 0) runs only that configuration. On a canary (a torch release no entry of
# torch_aot_rt/_versions.py covers) the suite runs once, with the C core alone (the
# C++ part is not built there, whatever TORCH_AOT_RT_CPP says), TORCH_AOT_RT_CANARY=1
# and `--require-marker canary`: the tests that check that the package changes
# nothing there must run, none of them skipped.
#
# Side by side: without TORCH_AOT_RT_TORCH, a set-up lane prepares the venvs one
# after the other, in the order below (downloads, installs, builds), while
# TORCH_AOT_RT_LANES test lanes (default 2, one per core) take the runs from a queue
# in the same order, each run starting once its release is set up: set-ups overlap
# tests, and both cores run tests until the queue is empty. Each step's output goes
# to a log file, printed whole when the step ends, each line prefixed by a word
# naming the step (2.13.0/cpp:, 2.13.0/c-core:, 2.10.0/canary:, 2.15.0/setup:).
# TORCH_AOT_RT_LANES=1, or TORCH_AOT_RT_TORCH, runs in the foreground, one after the
# other, the output as it comes.
#
# Exit status: 0 when every run passed, else the first failing status (in release
# order). A run that executes no test is a failure (exit 5), including "nothing
# collected" and "everything skipped/deselected"; so is a release whose set-up
# failed (its runs are not started). The summary at the end lists every run.
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

if [ ! -d tests ]; then
    echo "test.sh: no tests/ directory: failing" >&2
    exit 5
fi

# The order of set-ups and runs: 2.13.0 first (from nothing, about 2 min: 30 s of
# install from local files, then 80 s of build), so tests start early; 2.14.1 (local
# files, about 2.5 min), 2.15.0 (a download, about 2.5 to 4 min), 2.12.1 and 2.11.0
# (downloads, about 3 min each), then the canary
# (a download, about 3 min, the C core alone builds in seconds), whose
# set-up ends long before its run starts. Measured on 2 cores: a run of the suite
# takes about 4.5 min on a release, a canary run well under a minute.
if [ -n "${TORCH_AOT_RT_TORCH:-}" ]; then
    releases=("$TORCH_AOT_RT_TORCH")
else
    releases=("${TORCH_RELEASES[@]}" "${CANARY_RELEASES[@]}")
fi

# configs_of VERSION: the TORCH_AOT_RT_CPP values it runs with.
# A canary has one: as a user runs it (no TORCH_AOT_RT_CPP; setup.py skips the
# C++ part there, see scripts/setup_env.sh), whatever TORCH_AOT_RT_CPP says. So
# has a verified release the C++ part is not built for (not in CPP_RELEASES):
# both configurations would run the C core alone.
configs_of() {
    if is_canary "$1" || ! has_cpp_part "$1"; then
        echo 1
    elif [ -n "${TORCH_AOT_RT_CPP:-}" ]; then
        echo "$TORCH_AOT_RT_CPP"
    else
        echo 1 0
    fi
}

label_of() { # VERSION CPP
    local what
    if [ "$2" = "0" ]; then what="C core alone (TORCH_AOT_RT_CPP=0)"
    elif ! has_cpp_part "$1"; then what="C core (the C++ part is not built for it)"
    else what="with the C++ part"; fi
    if is_canary "$1"; then echo "torch $1, canary (installed and run as a user would)"
    else echo "torch $1, $what"; fi
}

# tag_of VERSION CPP: the one-word prefix of a lane's lines (pytest's closing line
# stays "WORD: N passed, ...").
tag_of() {
    if [ "$2" = "setup" ]; then echo "$1/setup:"
    elif is_canary "$1"; then echo "$1/canary:"
    elif [ "$2" = "0" ] || ! has_cpp_part "$1"; then echo "$1/c-core:"
    else echo "$1/cpp:"; fi
}

# run_config VERSION CPP PYTEST_ARGS...: one run of the suite, in that release's venv.
run_config() {
    local version="$1" cpp="$2" rc=0
    shift 2
    local -a canary_args=() where=(tests) arg
    if is_canary "$version"; then canary_args=(--require-marker canary); fi
    # Test files or node ids among the arguments replace the default `tests`
    # (pytest would otherwise collect both: the whole suite and the file).
    for arg in "$@"; do
        case "$arg" in
            tests/*) where=() ;;
        esac
    done
    # The C-core-alone run of a release that also runs with the C++ part
    # deselects the tests marked cpp_independent (tests/conftest.py): the gate,
    # the build, the loader and the switches, each checked in subprocesses that
    # do not depend on the C++ part, run once per release, in that run. (Asked
    # before TORCH_AOT_RT_CPP is exported below, which configs_of reads.)
    local once=""
    if [ "$cpp" = "0" ] && [ "$(configs_of "$version")" = "1 0" ]; then once=1; fi
    (
        torch_env "$version"
        # TORCH_AOT_RT_CANARY=1 tells the suite it must find an unverified torch.
        if is_canary "$version"; then export TORCH_AOT_RT_CANARY=1; fi
        export TORCH_AOT_RT_CPP="$cpp" PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
        if [ -n "$once" ]; then export TORCH_AOT_RT_ONCE_PER_RELEASE=1; fi
        run_py -m pytest -p pytest_require_tests "${where[@]}" -q "${canary_args[@]}" "$@" </dev/null
    ) || rc=$?
    if [ "$rc" -eq 5 ] && is_canary "$version"; then
        echo "test.sh: pytest ran no tests, or no test marked canary ($(label_of "$version" "$cpp"), exit 5): counted as a failure" >&2
    elif [ "$rc" -eq 5 ]; then
        echo "test.sh: pytest ran no tests ($(label_of "$version" "$cpp"), exit 5): counted as a failure" >&2
    fi
    return "$rc"
}

lanes="${TORCH_AOT_RT_LANES:-2}"
if ! [[ "$lanes" =~ ^[0-9]+$ ]]; then
    echo "test.sh: TORCH_AOT_RT_LANES=$lanes: not a number" >&2
    exit 2
fi
if [ -n "${TORCH_AOT_RT_TORCH:-}" ] || [ "$lanes" -le 1 ] || [ "${#releases[@]}" -le 1 ]; then
    # ---- in the foreground, one release after the other ----------------------------
    status=0
    summary=()
    for version in "${releases[@]}"; do
        setup_torch_env "$version"
        for cpp in $(configs_of "$version"); do
            label="$(label_of "$version" "$cpp")"
            echo "=== $label ($VENV) ===" >&2
            rc=0
            run_config "$version" "$cpp" "$@" || rc=$?
            summary+=("$label: exit $rc")
            if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
                status=$rc
            fi
        done
    done
    printf 'test.sh: %s\n' "${summary[@]}" >&2
    exit "$status"
fi

# ---- lanes ---------------------------------------------------------------------------
if ! command -v flock >/dev/null; then
    echo "test.sh: the lanes need flock (util-linux); TORCH_AOT_RT_LANES=1 runs without" >&2
    exit 2
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/torch_aot_rt-test.XXXXXX")"
# Two suites side by side on two cores: one thread each for torch's own parallel
# regions (a user's setting stands). Measured here on a quarter of the suite: 61 s
# alone; side by side 66 s each with one thread, 145 s each with torch's default
# (one thread per core: four busy threads on two cores).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# One set-up at a time (the set-up lane), so no two builds write into the checkout at
# once. A build replaces the module files in torch_aot_rt/ by new ones (setuptools
# unlinks the old file first), so a run that has one loaded keeps running on it; the
# C++ part's module is per torch release, and its runs start after its set-up.
echo 0 >"$WORK/next"
: >"$WORK/queue.lock"
: >"$WORK/out.lock"

lane_pids=()
# shellcheck disable=SC2329  # the EXIT trap's
cleanup() {
    local pid log
    if [ "${#lane_pids[@]}" -gt 0 ]; then
        for pid in "${lane_pids[@]}"; do
            kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
        done
        # interrupted: what the steps under way had written so far
        for log in "$WORK"/log-*; do
            case "$log" in *.tag | *.label | *.shown) continue ;; esac
            if [ -f "$log" ] && [ ! -e "$log.shown" ]; then
                echo "test.sh: interrupted; the log of $(cat "$log.label") so far:" >&2
                sed "s|^|$(cat "$log.tag") |" "$log" >&2
            fi
        done
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# next_run: the queue's next index into runs[], or nothing when it is empty.
runs=() # "IDX CPP": a release (its index in releases[]) and a configuration
for idx in "${!releases[@]}"; do
    for cpp in $(configs_of "${releases[$idx]}"); do runs+=("$idx $cpp"); done
done
next_run() {
    (
        flock 9
        local n
        n="$(cat "$WORK/next")"
        echo $((n + 1)) >"$WORK/next"
        if [ "$n" -lt "${#runs[@]}" ]; then echo "$n"; fi
    ) 9>>"$WORK/queue.lock"
}

# say TEXT: one line about a lane's progress, to stderr.
say() { (flock 9; echo "test.sh: $1" >&2) 9>>"$WORK/out.lock"; }

# start_log LOG TAG LABEL: a step's log, empty, with what cleanup needs to show it.
start_log() { : >"$1"; echo "$2" >"$1.tag"; echo "$3" >"$1.label"; }

# show TAG LOG: the log of one step, whole, each line prefixed by TAG, to stdout.
show() { (flock 9; sed "s|^|$1 |" "$2"; : >"$2.shown") 9>>"$WORK/out.lock"; }

seconds_since() { echo $(($(date +%s) - $1)); }

# setup_lane: every release's set-up, in order. Each writes $WORK/setup-IDX
# ("EXIT SECONDS") when it ends: the runs of that release wait for it.
setup_lane() {
    local idx version rc t0 log
    set +m # what the lane starts stays in its process group
    for idx in "${!releases[@]}"; do
        version="${releases[$idx]}"
        log="$WORK/log-$idx-setup"
        start_log "$log" "$(tag_of "$version" setup)" "the set-up of torch $version"
        say "torch $version: set-up started"
        t0="$(date +%s)"
        rc=0
        # in a background subshell: set -e stays in force inside it
        (setup_torch_env "$version") >"$log" 2>&1 </dev/null &
        wait $! || rc=$?
        show "$(tag_of "$version" setup)" "$log"
        say "torch $version: set-up exit $rc ($(seconds_since "$t0") s)"
        echo "$rc $(seconds_since "$t0")" >"$WORK/setup-$idx.tmp"
        mv "$WORK/setup-$idx.tmp" "$WORK/setup-$idx"
    done
}

# test_lane LANE PYTEST_ARGS...: runs from the queue until it is empty, each once its
# release is set up. Results in $WORK/result-IDX-CPP ("EXIT SECONDS [setup]").
test_lane() {
    local lane="$1" n idx cpp version label rc secs t0 log
    shift
    set +m
    while n="$(next_run)" && [ -n "$n" ]; do
        read -r idx cpp <<<"${runs[$n]}"
        version="${releases[$idx]}"
        label="$(label_of "$version" "$cpp")"
        while [ ! -f "$WORK/setup-$idx" ] && kill -0 "$setup_pid" 2>/dev/null; do sleep 1; done
        if [ ! -f "$WORK/setup-$idx" ]; then
            continue # the set-up lane ended without it: the summary says so
        fi
        read -r rc secs <"$WORK/setup-$idx"
        if [ "$rc" -ne 0 ]; then
            echo "$rc 0 setup" >"$WORK/result-$idx-$cpp"
            continue
        fi
        log="$WORK/log-$idx-$cpp"
        start_log "$log" "$(tag_of "$version" "$cpp")" "$label"
        say "$label: started (lane $lane)"
        t0="$(date +%s)"
        rc=0
        run_config "$version" "$cpp" "$@" >"$log" 2>&1 || rc=$?
        echo "$rc $(seconds_since "$t0")" >"$WORK/result-$idx-$cpp"
        show "$(tag_of "$version" "$cpp")" "$log"
        say "$label: exit $rc ($(seconds_since "$t0") s, lane $lane)"
    done
}

t_start="$(date +%s)"
# set -m: each lane in its own process group, so cleanup can end all of it
set -m
setup_lane &
setup_pid=$!
lane_pids+=("$setup_pid")
for ((lane = 1; lane <= lanes; lane++)); do
    test_lane "$lane" "$@" &
    lane_pids+=("$!")
done
set +m
lane_status=0
for pid in "${lane_pids[@]}"; do
    wait "$pid" || lane_status=$?
done
lane_pids=()

status=0
summary=()
times=()
for idx in "${!releases[@]}"; do
    version="${releases[$idx]}"
    if [ -f "$WORK/setup-$idx" ]; then
        read -r rc secs <"$WORK/setup-$idx"
        times+=("set-up of torch $version: exit $rc, ${secs} s")
    fi
    for cpp in $(configs_of "$version"); do
        label="$(label_of "$version" "$cpp")"
        rc=1 secs=0 why=""
        if [ -f "$WORK/result-$idx-$cpp" ]; then
            read -r rc secs why <"$WORK/result-$idx-$cpp"
        else
            why="lane"
        fi
        case "$why" in
            setup) summary+=("$label: exit $rc (set-up failed, not run)") ;;
            lane) summary+=("$label: exit $rc (not run: a lane failed, exit $lane_status)") ;;
            *) summary+=("$label: exit $rc"); times+=("$label: ${secs} s") ;;
        esac
        if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$rc
        fi
    done
done
times+=("wall time: $(seconds_since "$t_start") s (a set-up lane and $lanes test lanes)")
printf 'test.sh: %s\n' "${times[@]}" >&2
printf 'test.sh: %s\n' "${summary[@]}" >&2
exit "$status"
