#!/usr/bin/env bash
# Set up and run the test suite on every torch release in TORCH_RELEASES and on every
# canary in CANARY_RELEASES (scripts/setup_env.sh), each in its own venv (.venv-2.13,
# .venv-2.14, ...), each with a fresh build of the C extension.
#   bash scripts/test.sh                          # everything, every release and canary
#   bash scripts/test.sh -k mutation -x           # extra arguments go to pytest (every run)
#   TORCH_AOT_RT_TORCH=2.14.1 bash scripts/test.sh  # one release (or canary) only
# On each release the suite runs twice: with the C++ part (csrc/cpp/, built for that
# torch) and with the C core alone (TORCH_AOT_RT_CPP=0). Setting TORCH_AOT_RT_CPP
# (1 or 0) runs only that configuration. On a canary (a torch release no entry of
# torch_aot_rt/_versions.py covers) the suite runs once, with the C core alone (the
# C++ part is not built there), TORCH_AOT_RT_CANARY=1 and `--require-marker canary`:
# the tests that check that the package changes nothing there must run, none of them
# skipped.
#
# Side by side: without TORCH_AOT_RT_TORCH, the releases are shared out to
# TORCH_AOT_RT_LANES lanes (default 2, one per core), each taking the next release
# from the queue below when it is done with one (set-up, then its runs), so one
# lane's set-up (downloads) overlaps the other's tests. A lane's output goes to log
# files, printed whole, each line prefixed by its label, as each step ends.
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

# The queue, in order: 2.13.0 first (its set-up is short: its tests start at once),
# 2.14.1 (local files, ~2 min of set-up) beside it, then 2.15.0 and the canaries,
# whose downloads overlap those tests. Measured (2 cores): a run of the suite takes
# about 4.5 min on a release, a canary run well under a minute.
if [ -n "${TORCH_AOT_RT_TORCH:-}" ]; then
    releases=("$TORCH_AOT_RT_TORCH")
else
    releases=("${TORCH_RELEASES[@]}" "${CANARY_RELEASES[@]}")
fi

# configs_of VERSION: the TORCH_AOT_RT_CPP values it runs with.
configs_of() {
    if [ -n "${TORCH_AOT_RT_CPP:-}" ]; then
        echo "$TORCH_AOT_RT_CPP"
    elif is_canary "$1"; then
        echo 0 # the C++ part is not built there (scripts/setup_env.sh)
    else
        echo 1 0
    fi
}

label_of() { # VERSION CPP
    local what
    if [ "$2" = "0" ]; then what="C core alone (TORCH_AOT_RT_CPP=0)"
    else what="with the C++ part"; fi
    if is_canary "$1"; then echo "torch $1, canary, $what"
    else echo "torch $1, $what"; fi
}

# tag_of VERSION CPP: the one-word prefix of a lane's lines (pytest's closing line
# stays "WORD: N passed, ...").
tag_of() {
    if [ "$2" = "setup" ]; then echo "$1/setup:"
    elif is_canary "$1"; then echo "$1/canary:"
    elif [ "$2" = "0" ]; then echo "$1/c-core:"
    else echo "$1/cpp:"; fi
}

# run_config VERSION CPP PYTEST_ARGS...: one run of the suite, in that release's venv.
run_config() {
    local version="$1" cpp="$2" rc=0
    shift 2
    local -a canary_args=()
    if is_canary "$version"; then canary_args=(--require-marker canary); fi
    (
        torch_env "$version"
        # TORCH_AOT_RT_CANARY=1 tells the suite it must find an unverified torch.
        if is_canary "$version"; then export TORCH_AOT_RT_CANARY=1; fi
        export TORCH_AOT_RT_CPP="$cpp" PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
        run_py -m pytest -p pytest_require_tests tests -q "${canary_args[@]}" "$@" </dev/null
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
    echo "test.sh: running side by side needs flock (util-linux); TORCH_AOT_RT_LANES=1 runs without" >&2
    exit 2
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/torch_aot_rt-test.XXXXXX")"
export TORCH_AOT_RT_BUILD_LOCK="$WORK/build.lock"
# Two suites side by side on two cores: one thread each for torch's own parallel
# regions (a user's setting stands).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
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

# next_release: the queue's next index, or nothing when it is empty.
next_release() {
    (
        flock 9
        local n
        n="$(cat "$WORK/next")"
        echo $((n + 1)) >"$WORK/next"
        if [ "$n" -lt "${#releases[@]}" ]; then echo "$n"; fi
    ) 9>>"$WORK/queue.lock"
}

# say LANE TEXT: one line of the lane's own, to stderr.
say() { (flock 9; echo "[lane $1] $2" >&2) 9>>"$WORK/out.lock"; }

# start_log LOG TAG LABEL: a step's log, empty, with what cleanup needs to show it.
start_log() { : >"$1"; echo "$2" >"$1.tag"; echo "$3" >"$1.label"; }

# show TAG LOG: the log of one step, whole, each line prefixed by TAG, to stdout.
show() { (flock 9; sed "s|^|$1 |" "$2"; : >"$2.shown") 9>>"$WORK/out.lock"; }

seconds_since() { echo $(($(date +%s) - $1)); }

# run_lane LANE PYTEST_ARGS...: releases from the queue until it is empty. Results in
# $WORK/result-IDX-CPP ("EXIT SECONDS"), set-up times in $WORK/setup-IDX.
run_lane() {
    local lane="$1" idx version cpp rc run_rc t0 log tag
    shift
    set +m # what the lane starts stays in its process group
    while idx="$(next_release)" && [ -n "$idx" ]; do
        version="${releases[$idx]}"
        tag="$(tag_of "$version" setup)"
        log="$WORK/log-$idx-setup"
        start_log "$log" "$tag" "the set-up of torch $version"
        say "$lane" "torch $version: set-up started"
        t0="$(date +%s)"
        rc=0
        # in a background subshell: set -e stays in force inside it
        (setup_torch_env "$version") >"$log" 2>&1 </dev/null &
        wait $! || rc=$?
        echo "$rc $(seconds_since "$t0")" >"$WORK/setup-$idx"
        show "$tag" "$log"
        say "$lane" "torch $version: set-up exit $rc ($(seconds_since "$t0") s)"
        for cpp in $(configs_of "$version"); do
            if [ "$rc" -ne 0 ]; then
                echo "$rc 0 setup" >"$WORK/result-$idx-$cpp"
                continue
            fi
            log="$WORK/log-$idx-$cpp"
            start_log "$log" "$(tag_of "$version" "$cpp")" "$(label_of "$version" "$cpp")"
            say "$lane" "$(label_of "$version" "$cpp"): started"
            t0="$(date +%s)"
            run_rc=0
            run_config "$version" "$cpp" "$@" >"$log" 2>&1 || run_rc=$?
            echo "$run_rc $(seconds_since "$t0")" >"$WORK/result-$idx-$cpp"
            show "$(tag_of "$version" "$cpp")" "$log"
            say "$lane" "$(label_of "$version" "$cpp"): exit $run_rc ($(seconds_since "$t0") s)"
        done
    done
}

t_start="$(date +%s)"
for ((lane = 1; lane <= lanes; lane++)); do
    # set -m: each lane in its own process group, so cleanup can end all of it
    set -m
    run_lane "$lane" "$@" &
    set +m
    lane_pids+=("$!")
done
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
            lane) summary+=("$label: exit $rc (not run: its lane failed, exit $lane_status)") ;;
            *) summary+=("$label: exit $rc"); times+=("$label: ${secs} s") ;;
        esac
        if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$rc
        fi
    done
done
times+=("wall time: $(seconds_since "$t_start") s in $lanes lanes")
printf 'test.sh: %s\n' "${times[@]}" >&2
printf 'test.sh: %s\n' "${summary[@]}" >&2
exit "$status"
