#!/usr/bin/env bash
# The CUDA check, as one script for a GPU machine that has a CUDA build of torch,
# pytest and pytest-xdist installed (nothing is fetched).
# From the repository root, on that machine:
#   bash scripts/cuda_check.sh          # logs under $OUT (the tool's), else ./cuda-check
# 1. builds torch_aot_rt in place against the machine's torch (C core and C++ part);
# 2. runs the whole suite with the device parameter on CUDA
#    (TORCH_AOT_RT_REQUIRE_CUDA=1: it fails where torch sees no GPU) with the C++
#    part, on 12 xdist workers;
# 3. runs benchmarks/cuda_e2e.py on CUDA (wall time per call, upstream vs C, one
#    process, mode="default" and "reduce-overhead");
# 4. runs the suite again with the C core alone (TORCH_AOT_RT_CPP=0).
# Exit status: the first failing step's, after every step has run. Each step has
# its own time limit (590 s in all): give the command 600 s.
set -uo pipefail
out="${OUT:-cuda-check}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
status=0
step() { # NAME RC
    echo "cuda_check: $1: exit $2"
    if [ "$2" -ne 0 ] && [ "$status" -eq 0 ]; then status=$2; fi
}

{ date -u; nvidia-smi -L; "$py" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'; } \
    2>&1 | tee "$out/device.txt"
timeout 150 "$py" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps -e . \
    > "$out/build.log" 2>&1
rc=$?; step build "$rc"
if [ "$rc" -ne 0 ]; then tail -n 40 "$out/build.log"; exit "$rc"; fi
"$py" -c 'import json, torch_aot_rt; print(json.dumps(torch_aot_rt.stats()["torch"]))' \
    2>&1 | tee -a "$out/device.txt"

# suite NAME CPP SECONDS: the whole suite on 12 xdist workers, its log under $out
suite() {
    TORCH_AOT_RT_REQUIRE_CUDA=1 TORCH_AOT_RT_CPP=$2 timeout "$3" \
        "$py" -m pytest -p pytest_require_tests -p no:cacheprovider -n 12 -q -rfEs tests \
        > "$out/suite-$1.log" 2>&1
    local rc=$?
    tail -n 15 "$out/suite-$1.log"
    step "suite, $1 (TORCH_AOT_RT_CPP=$2)" "$rc"
}

# the order of importance, so that a run cut short keeps the first ones
suite cpp 1 200
timeout 120 "$py" benchmarks/cuda_e2e.py --json "$out/bench.json" 2>&1 | tee "$out/bench.txt"
step "benchmarks/cuda_e2e.py" "${PIPESTATUS[0]}"
suite c-core 0 120
exit "$status"
