#!/usr/bin/env bash
# Set up and run the test suite in every environment of ENVIRONMENTS
# (scripts/setup_env.sh): a (torch release, CPython) pair, each in its own venv
# (.venv-2.15-py3.12, ...), each with a fresh build of the C extension.
#   bash scripts/test.sh                          # everything
#   bash scripts/test.sh -k mutation -x           # extra arguments go to pytest (every run)
#   bash scripts/test.sh tests/cpp/test_cpp.py -x      # test paths (tests/...) replace the default tests/
#   TORCH_AOT_RT_TORCH=2.14.1 bash scripts/test.sh  # the environments of one torch release
#   TORCH_AOT_RT_PYTHON=3.12 bash scripts/test.sh   # the environments of one CPython
# Each environment lists its configurations, each one run of the suite: cpp (with the
# C++ part, csrc/cpp/, built for that torch), c-core (the C core alone,
# TORCH_AOT_RT_CPP=0), canary (a torch release no entry of torch_aot_rt/_versions.py
# covers, installed and run as a user would, with TORCH_AOT_RT_CANARY=1 and
# `--require-marker canary`: the tests that check that the package changes nothing
# there must run, none of them skipped). Where an environment runs both cpp and
# c-core, the tests marked cpp_independent (subprocess checks of the gate, build,
# loader and switches) run in the first only. Setting TORCH_AOT_RT_CPP (1 or 0) runs
# only that configuration (a canary runs as it is).
#
# Side by side: without a selection, a set-up lane prepares the venvs one after the
# other, in ENVIRONMENTS' order (interpreters, downloads, installs, builds), while
# TORCH_AOT_RT_LANES test lanes (default 2, one per core) take the runs from a queue
# in the same order, each run starting once its environment is set up: set-ups
# overlap tests, and both cores run tests until the queue is empty. Each step's
# output goes to a log file, printed whole when the step ends, each line prefixed by
# a word naming the step (2.13-py3.11/cpp:, 2.13-py3.11/c-core:, 2.10-py3.11/canary:,
# 2.15-py3.12/setup:). TORCH_AOT_RT_LANES=1, or a selection of one environment, runs
# in the foreground, one after the other, the output as it comes.
#
# Exit status: 0 when every run passed, else the first failing status (in
# ENVIRONMENTS' order). A run that executes no test is a failure (exit 5), including
# "nothing collected" and "everything skipped/deselected"; so is an environment whose
# set-up failed (its runs are not started). The summary at the end lists every run,
# with its time.
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

if [ ! -d tests ]; then
    echo "test.sh: no tests/ directory: failing" >&2
    exit 5
fi

# The environments selected: all, or those of TORCH_AOT_RT_TORCH and/or
# TORCH_AOT_RT_PYTHON. Measured on 2 cores: a run of the suite takes about 5 to 8
# minutes beside another; a set-up from nothing 1 to 4 minutes (2.13.0 and 3.11's
# 2.14.1 install from local files; the others download a CUDA build of torch).
# TORCH_AOT_RT_PAIRS=all: every pair the gate verifies instead (scripts/setup_env.sh
# every_verified_pair), each with the C++ part; =extra: those of them ENVIRONMENTS
# does not run; a list of pairs, "2.14.1/3.12 2.13.0/3.13": those, in that order.
# With TORCH_AOT_RT_DROP_VENVS=1 (.ci/run's default) each venv is removed once its
# last run has ended, and the set-ups wait for the runs (at most one environment per
# test lane and one more set up and not yet done, one while the disk has under 12 GB
# free), so that the disk holds a few venvs at a time (a CUDA build's is 5 to 7 GB).
kept_venv() { # TORCH PYTHON: whether ENVIRONMENTS has this venv
    local e
    for e in "${ENVIRONMENTS[@]}"; do
        if [ "$(env_torch "$e")" = "$1" ] && [ "$(env_python "$e")" = "$2" ]; then return 0; fi
    done
    return 1
}
case "${TORCH_AOT_RT_PAIRS:-}" in
    "") selection=("${ENVIRONMENTS[@]}") ;;
    all) mapfile -t selection < <(every_verified_pair) ;;
    extra)
        selection=()
        while read -r entry; do
            if ! kept_venv "$(env_torch "$entry")" "$(env_python "$entry")"; then
                selection+=("$entry")
            fi
        done < <(every_verified_pair)
        ;;
    *)
        # a list of verified pairs, in the order given: "2.14.1/3.12 2.13.0/3.13"
        selection=()
        mapfile -t verified < <(every_verified_pair)
        for pair in $TORCH_AOT_RT_PAIRS; do
            entry="${pair%/*} ${pair#*/} cpp"
            if [[ " ${verified[*]/%/,} " != *" $entry, "* ]]; then
                echo "test.sh: TORCH_AOT_RT_PAIRS: $pair is not a pair the gate verifies" \
                    "(all, extra, or TORCH/PYTHON pairs such as 2.14.1/3.12)" >&2
                exit 2
            fi
            selection+=("$entry")
        done
        ;;
esac
drop_venv() { # ENTRY: with TORCH_AOT_RT_DROP_VENVS=1, its venv
    if [ "${TORCH_AOT_RT_DROP_VENVS:-}" = 1 ]; then
        torch_env "$(env_torch "$1")" "$(env_python "$1")"
        rm -rf "$VENV"
    fi
}
envs=()
for entry in "${selection[@]}"; do
    if [ -n "${TORCH_AOT_RT_TORCH:-}" ] && [ "$(env_torch "$entry")" != "$TORCH_AOT_RT_TORCH" ]; then
        continue
    fi
    if [ -n "${TORCH_AOT_RT_PYTHON:-}" ] && [ "$(env_python "$entry")" != "$TORCH_AOT_RT_PYTHON" ]; then
        continue
    fi
    envs+=("$entry")
done
if [ "${#envs[@]}" -eq 0 ]; then
    echo "test.sh: no environment of scripts/setup_env.sh has torch ${TORCH_AOT_RT_TORCH:-any}" \
        "and CPython ${TORCH_AOT_RT_PYTHON:-any}" >&2
    exit 2
fi

is_canary_env() { [[ " $(env_configs "$1") " == *" canary "* ]]; }

# configs_of ENTRY: the configurations it runs (TORCH_AOT_RT_CPP picks one of cpp and
# c-core; a canary runs as it is).
configs_of() {
    if is_canary_env "$1"; then echo canary
    elif [ "${TORCH_AOT_RT_CPP:-}" = "1" ]; then echo cpp
    elif [ "${TORCH_AOT_RT_CPP:-}" = "0" ]; then echo c-core
    else env_configs "$1"; fi
}

label_of() { # ENTRY CONFIG
    local what
    case "$2" in
        cpp) what="with the C++ part" ;;
        c-core) what="C core alone (TORCH_AOT_RT_CPP=0)" ;;
        canary) what="canary (installed and run as a user would)" ;;
        setup) what="set-up" ;;
    esac
    echo "torch $(env_torch "$1") on CPython $(env_python "$1"), $what"
}

# tag_of ENTRY CONFIG: the one-word prefix of a lane's lines (pytest's closing line
# stays "WORD: N passed, ...").
tag_of() { echo "$(env_name "$(env_torch "$1")" "$(env_python "$1")")/$2:"; }

setup_entry() { # ENTRY
    setup_torch_env "$(env_torch "$1")" "$(env_python "$1")" "$(is_canary_env "$1" && echo 1)"
}

# run_config ENTRY CONFIG PYTEST_ARGS...: one run of the suite, in that environment's venv.
run_config() {
    local entry="$1" config="$2" rc=0
    shift 2
    local -a canary_args=() where=(tests) arg
    if [ "$config" = canary ]; then canary_args=(--require-marker canary); fi
    # Test files or node ids among the arguments replace the default `tests`
    # (pytest would otherwise collect both: the whole suite and the file).
    for arg in "$@"; do
        case "$arg" in
            tests/*) where=() ;;
        esac
    done
    # The C-core-alone run of an environment that also runs with the C++ part
    # deselects the tests marked cpp_independent (tests/conftest.py): the gate, the
    # build, the loader and the switches, each checked in subprocesses that do not
    # depend on the C++ part, run once per environment, in that run.
    local once=""
    if [ "$config" = c-core ] && [[ " $(configs_of "$entry") " == *" cpp "* ]]; then once=1; fi
    (
        torch_env "$(env_torch "$entry")" "$(env_python "$entry")"
        # TORCH_AOT_RT_CANARY=1 tells the suite it must find an unverified torch.
        if [ "$config" = canary ]; then export TORCH_AOT_RT_CANARY=1; fi
        local cpp=1
        if [ "$config" = c-core ]; then cpp=0; fi
        export TORCH_AOT_RT_CPP="$cpp" PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
        if [ -n "$once" ]; then export TORCH_AOT_RT_ONCE_PER_RELEASE=1; fi
        run_py -m pytest -p pytest_require_tests "${where[@]}" -q "${canary_args[@]}" "$@" </dev/null
    ) || rc=$?
    if [ "$rc" -eq 5 ] && [ "$config" = canary ]; then
        echo "test.sh: pytest ran no tests, or no test marked canary ($(label_of "$entry" "$config"), exit 5): counted as a failure" >&2
    elif [ "$rc" -eq 5 ]; then
        echo "test.sh: pytest ran no tests ($(label_of "$entry" "$config"), exit 5): counted as a failure" >&2
    fi
    return "$rc"
}

lanes="${TORCH_AOT_RT_LANES:-2}"
if ! [[ "$lanes" =~ ^[0-9]+$ ]]; then
    echo "test.sh: TORCH_AOT_RT_LANES=$lanes: not a number" >&2
    exit 2
fi
if [ "$lanes" -le 1 ] || [ "${#envs[@]}" -le 1 ]; then
    # ---- in the foreground, one environment after the other ------------------------
    status=0
    summary=()
    for entry in "${envs[@]}"; do
        setup_entry "$entry"
        for config in $(configs_of "$entry"); do
            label="$(label_of "$entry" "$config")"
            echo "=== $label ($VENV) ===" >&2
            rc=0
            t0=$SECONDS
            run_config "$entry" "$config" "$@" || rc=$?
            summary+=("$label: exit $rc ($((SECONDS - t0)) s)")
            if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
                status=$rc
            fi
        done
        drop_venv "$entry"
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
runs=() # "IDX CONFIG": an environment (its index in envs[]) and a configuration
for idx in "${!envs[@]}"; do
    for config in $(configs_of "${envs[$idx]}"); do runs+=("$idx $config"); done
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

count_in() { find "$1" -maxdepth 1 -name "$2" | wc -l; } # DIR GLOB

# env_done IDX: once every run of that environment has a result, its venv is dropped
# (TORCH_AOT_RT_DROP_VENVS=1) and $WORK/done-IDX written; under the queue's lock, so
# that of two lanes ending the last two runs at once, one does it.
env_done() {
    (
        flock 9
        local config
        [ ! -e "$WORK/done-$1" ] || exit 0
        for config in $(configs_of "${envs[$1]}"); do
            [ -f "$WORK/result-$1-$config" ] || exit 0
        done
        drop_venv "${envs[$1]}"
        : >"$WORK/done-$1"
    ) 9>>"$WORK/queue.lock"
}

# setup_lane: every environment's set-up, in order. Each writes $WORK/setup-IDX
# ("EXIT SECONDS") when it ends: the runs of that environment wait for it.
setup_lane() {
    local idx entry rc t0 log label why pending
    set +m # what the lane starts stays in its process group
    for idx in "${!envs[@]}"; do
        entry="${envs[$idx]}"
        label="$(label_of "$entry" setup)"
        if [ "${TORCH_AOT_RT_DROP_VENVS:-}" = 1 ]; then
            # at most one environment per test lane and one more (ready for the
            # lane that ends first) set up and not yet done; one where the disk is
            # short (the runs under way free their venvs as they end)
            while pending="$(($(count_in "$WORK" 'setup-*') - $(count_in "$WORK" 'done-*')))" &&
                { [ "$pending" -ge $((lanes + 1)) ] ||
                    { [ "$pending" -ge 1 ] && [ "$(free_gb "$ROOT")" -lt 12 ]; }; }; do
                sleep 5
            done
        fi
        log="$WORK/log-$idx-setup"
        start_log "$log" "$(tag_of "$entry" setup)" "$label"
        say "$label: started"
        t0="$(date +%s)"
        rc=0
        # in a background subshell: set -e stays in force inside it
        (setup_entry "$entry") >"$log" 2>&1 </dev/null &
        wait $! || rc=$?
        show "$(tag_of "$entry" setup)" "$log"
        say "$label: exit $rc ($(seconds_since "$t0") s)"
        # a failed set-up's reason goes into the summary: its first "error:" line
        # (pip's build output), else its last line (set-up's own "[setup] ...")
        why=""
        if [ "$rc" -ne 0 ]; then
            why="$(grep -m 1 'error: ' "$log" || grep -v '^[[:space:]]*$' "$log" | tail -n 1)" || true
            why="$(echo "$why" | sed 's/^[[:space:]]*//' | cut -c 1-300)"
        fi
        echo "$rc $(seconds_since "$t0") $why" >"$WORK/setup-$idx.tmp"
        mv "$WORK/setup-$idx.tmp" "$WORK/setup-$idx"
        if [ "$rc" -ne 0 ]; then
            drop_venv "$entry"
            : >"$WORK/done-$idx"
        fi
    done
}

# test_lane LANE PYTEST_ARGS...: runs from the queue until it is empty, each once its
# release is set up. Results in $WORK/result-IDX-CPP ("EXIT SECONDS [setup]").
test_lane() {
    local lane="$1" n idx cpp entry label rc secs t0 log
    shift
    set +m
    while n="$(next_run)" && [ -n "$n" ]; do
        read -r idx cpp <<<"${runs[$n]}"
        entry="${envs[$idx]}"
        label="$(label_of "$entry" "$cpp")"
        while [ ! -f "$WORK/setup-$idx" ] && kill -0 "$setup_pid" 2>/dev/null; do sleep 1; done
        if [ ! -f "$WORK/setup-$idx" ]; then
            continue # the set-up lane ended without it: the summary says so
        fi
        read -r rc secs _ <"$WORK/setup-$idx"
        if [ "$rc" -ne 0 ]; then
            echo "$rc 0 setup" >"$WORK/result-$idx-$cpp"
            continue
        fi
        log="$WORK/log-$idx-$cpp"
        start_log "$log" "$(tag_of "$entry" "$cpp")" "$label"
        say "$label: started (lane $lane)"
        t0="$(date +%s)"
        rc=0
        run_config "$entry" "$cpp" "$@" >"$log" 2>&1 || rc=$?
        echo "$rc $(seconds_since "$t0")" >"$WORK/result-$idx-$cpp"
        env_done "$idx"
        show "$(tag_of "$entry" "$cpp")" "$log"
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
for idx in "${!envs[@]}"; do
    entry="${envs[$idx]}"
    setup_why=""
    if [ -f "$WORK/setup-$idx" ]; then
        read -r rc secs setup_why <"$WORK/setup-$idx"
        times+=("$(label_of "$entry" setup): exit $rc, ${secs} s")
    fi
    for cpp in $(configs_of "$entry"); do
        label="$(label_of "$entry" "$cpp")"
        rc=1 secs=0 why=""
        if [ -f "$WORK/result-$idx-$cpp" ]; then
            read -r rc secs why <"$WORK/result-$idx-$cpp"
        else
            why="lane"
        fi
        case "$why" in
            setup) summary+=("$label: exit $rc (set-up failed, not run: $setup_why)") ;;
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
