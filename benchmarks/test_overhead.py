"""pytest-benchmark: the per-call cost of AOTAutograd's runtime wrapper and
CompiledFunction, direct / upstream / C.

    pytest benchmarks --benchmark-only

One group per configuration (per CompiledFunction row, per end-to-end row), so
the table puts direct, upstream and C of the same configuration together. pytest-benchmark runs the
variants one after the other, not interleaved: for ratios that noise hits
alike, use ``python benchmarks/report.py``.
"""

from __future__ import annotations

import functools

import pytest

from benchmarks import _cases, _e2e, _function


@functools.lru_cache(maxsize=None)
def _case(name):
    return _cases.build_case(name)


@functools.lru_cache(maxsize=None)
def _function_case(name):
    return _function.build_function_case(name)


@functools.lru_cache(maxsize=None)
def _e2e_case(name):
    return _e2e.build_e2e_case(name)


@pytest.mark.parametrize("variant", _cases.VARIANTS)
@pytest.mark.parametrize("config", list(_cases.CONFIGS))
def test_runtime_wrapper(benchmark, config, variant):
    case = _case(config)
    run = case.call(variant)
    if run is None:
        pytest.skip(case.c_note or f"{variant} unavailable")
    benchmark.group = f"runtime wrapper: {config}"
    benchmark.extra_info["description"] = case.description
    benchmark(run)


@pytest.mark.parametrize("config", list(_cases.CONFIGS))
def test_c_matches_upstream(config):
    """Not a benchmark: the C wrapper returns what upstream returns."""
    ok, msg = _cases.check_c_matches_upstream(_case(config))
    if ok is None:
        pytest.skip(msg)
    assert ok, msg


@pytest.mark.parametrize("variant", _function.VARIANTS)
@pytest.mark.parametrize("row", list(_function.ROWS))
def test_compiled_function(benchmark, row, variant):
    """CompiledFunction alone: fw = boxed apply, fw+bw = + torch.autograd.backward."""
    case = _function_case(row)
    run = case.call(variant)
    if run is None:
        pytest.skip(case.c_note or f"{variant} unavailable")
    benchmark.group = f"CompiledFunction: {row}"
    benchmark.extra_info["description"] = case.description
    benchmark(run)


@pytest.mark.parametrize("row", list(_function.ROWS))
def test_compiled_function_c_matches_upstream(row):
    """Not a benchmark: C and upstream CompiledFunction give the same outputs
    and grads (real compile), and the measured apply returns the same."""
    ok, msg = _function.check_c_matches_upstream(_function_case(row))
    if ok is None:
        pytest.skip(msg)
    assert ok, msg


E2E_ROWS = tuple(_e2e.ROWS)


@pytest.mark.parametrize("variant", ("eager", "upstream", "c"))
@pytest.mark.parametrize("row", E2E_ROWS)
def test_end_to_end(benchmark, row, variant):
    case = _e2e_case(row)
    run = case.call(variant)
    if run is None:
        pytest.skip(case.c_note or f"{variant} unavailable")
    benchmark.group = f"torch.compile aot_eager: {row}"
    benchmark.extra_info["description"] = case.description
    with case.context(), case.switched(variant):
        benchmark(run)


@pytest.mark.parametrize("row", E2E_ROWS)
def test_end_to_end_c_matches_upstream(row):
    """Not a benchmark: the compiled function gives the same output (and
    grad, in the backward row) with the C runtime as with upstream's."""
    ok, msg = _e2e.check_c_matches_upstream(_e2e_case(row))
    if ok is None:
        pytest.skip(msg)
    assert ok, msg
