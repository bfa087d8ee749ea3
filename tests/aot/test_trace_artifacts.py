"""Structured-trace artifacts (TORCH_TRACE / tlparse) for the C runtime
wrapper (torch_aot_rt/_trace.py).

A program run once with the C runtime off and once on, each in a subprocess
with TORCH_TRACE set: the runtime-wrapper sources upstream logs and the C
plan's descriptions we log in their place come out in the same shape. On
2.13/2.14 each is its own artifact, named after it (output_alias_wrapper and
mutation_epilogue where the graph has them, then runtime_wrapper_orchestration);
on 2.15 (``Release.aggregates_runtime_wrapper_trace``) a compile, and a cache
hit, log ONE ``aot_autograd_runtime_wrappers`` artifact of ``# <name>`` blocks
in codegen order, and a wrapper built outside such a scope logs one such
artifact per source. The C blocks describe the C plan (mutations, alias
regeneration, detaches, grad mode). With tracing off, no description is built.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from functorch.compile import aot_function, nop

import _trace_log
import torch_aot_rt
from _trace_log import split_blocks
from torch_aot_rt import _trace, _versions

pytestmark = [pytest.mark.needs_c, pytest.mark.cpp_independent]

RELEASE = _versions.resolve(torch.__version__).release
AGGREGATED = "aot_autograd_runtime_wrappers"
OURS = ("runtime_wrapper_orchestration", "output_alias_wrapper", "mutation_epilogue")
MARKER = "torch_aot_rt_test_phase"

PROGRAM = r'''
import torch
import torch._dynamo
import torch_aot_rt  # noqa: F401 (TORCH_AOT_RT decides whether it acts)
import torch._functorch._aot_autograd.runtime_wrappers as rw
from functorch.compile import aot_function, nop

def phase(name):
    torch._logging.trace_structured(
        "artifact", metadata_fn=lambda: {"name": "torch_aot_rt_test_phase", "encoding": "string"},
        payload_fn=lambda: name)

def inference_mutation(x, buf):
    buf.add_(1)  # aot_function: applied by the runtime epilogue
    return x * 2, x.view(-1)

def training_alias(x, w):
    y = x * w
    return y, y.view(-1), x.t()

def cached(x, w):
    return (x * w).sin(), x.view(-1)

phase("compile")
aot_function(inference_mutation, fw_compiler=nop)(torch.randn(2, 3), torch.zeros(2, 3))
torch.compile(training_alias, backend="aot_eager")(
    torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True))

phase("cache")  # a miss, then a hit (AOTAutogradCache's wrap_post_compile)
with torch._functorch.config.patch(enable_autograd_cache=True, force_autograd_cache=True,
                                   bundled_autograd_cache=True):
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(cached, backend="aot_eager")(
            torch.randn(2, 3, requires_grad=True), torch.randn(2, 3))

# what a compile passed _create_runtime_wrapper, to call it again outside
# any compile (and outside 2.15's aggregation scopes)
captured = []
installed = rw._create_runtime_wrapper
def spy(compiled_fn, **kwargs):
    captured.append((compiled_fn, kwargs))
    return installed(compiled_fn, **kwargs)
rw._create_runtime_wrapper = spy
phase("spy")
aot_function(inference_mutation, fw_compiler=nop)(torch.randn(2, 3), torch.zeros(2, 3))
rw._create_runtime_wrapper = installed
phase("outside")
compiled_fn, kwargs = captured[-1]
wrapper = installed(compiled_fn, **kwargs)
x, buf = torch.randn(2, 3), torch.zeros(2, 3)
out = wrapper([x, buf])
assert torch.equal(buf, torch.ones(2, 3)) and torch.equal(out[0], x * 2)
phase("end")
'''


def read_artifacts(trace_dir):
    """[(name, payload)] of the runtime-wrapper artifacts and the phase
    markers, in log order."""
    return _trace_log.read_artifacts(trace_dir, OURS + (AGGREGATED, MARKER))


def by_phase(artifacts) -> dict:
    """{phase: [(artifact name, [(block name, text)] or the payload)]}"""
    phases: dict = {}
    current = None
    for name, payload in artifacts:
        if name == MARKER:
            current = payload
            phases[current] = []
            continue
        assert current is not None, name
        phases[current].append((name, split_blocks(payload) if name == AGGREGATED else payload))
    return phases


def shape(phases) -> dict:
    """The names only: {phase: [(artifact, [block names])]}."""
    return {
        p: [(n, [b for b, _ in body] if n == AGGREGATED else None) for n, body in arts]
        for p, arts in phases.items()
    }


def run_traced(tmp_path, c_on: bool):
    trace_dir = tmp_path / ("on" if c_on else "off")
    trace_dir.mkdir()
    from _root import ROOT as root
    env = dict(
        os.environ, TORCH_TRACE=str(trace_dir), TORCH_AOT_RT="1" if c_on else "0",
        TORCHINDUCTOR_CACHE_DIR=str(trace_dir / "cache"),
        PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    )
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=600)
    return by_phase(read_artifacts(str(trace_dir)))


def _ours(phases):
    """[(name, text)] of every description or source under our names."""
    found = []
    for arts in phases.values():
        for name, body in arts:
            if name == AGGREGATED:
                found += [(b, t) for b, t in body if b in OURS]
            else:
                found.append((name, body))
    return found


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    if RELEASE is None:
        pytest.skip(f"torch {torch.__version__} is not a verified release")
    tmp = tmp_path_factory.mktemp("trace")
    return run_traced(tmp, False), run_traced(tmp, True)


def test_same_artifacts_and_c_plan_described(traced):
    off, on = traced
    assert set(off) == {"compile", "cache", "spy", "outside", "end"}, list(off)
    if not RELEASE.runtime_wrapper_generated:
        # 2.12: the reference Python runs; nothing is generated, nothing
        # logged, by upstream or by us
        assert _ours(off) == [] and _ours(on) == [], (_ours(off), _ours(on))
        assert shape(on) == shape(off)
        return
    assert _ours(off), "upstream logged no runtime-wrapper artifact"
    assert shape(on) == shape(off)
    for name, payload in _ours(on):
        assert payload.startswith(_trace.HEADER), payload
        assert f"# artifact: {name}" in payload
    for name, payload in _ours(off):  # upstream's are its Python source
        assert not payload.startswith(_trace.HEADER)
        assert "def " in payload
    orch = [p for n, p in _ours(on) if n == "runtime_wrapper_orchestration"]
    inference, training = orch[:2]  # the "compile" phase
    assert "inference: grad mode off" in inference
    assert "mutation epilogue (1 mutated inputs)" in inference
    assert ".copy_(updated[0])" in inference
    assert "training: grad mode on and view replay on" in training
    assert "regenerated from graph output" in training or "regenerated from input" in training
    # the blocks that are upstream's source on both sides are the same source
    for (n_off, b_off), (n_on, b_on) in zip(
        [a for arts in off.values() for a in arts], [a for arts in on.values() for a in arts]
    ):
        if n_off == AGGREGATED:
            assert [t for b, t in b_off if b not in OURS] == [t for b, t in b_on if b not in OURS]


def test_artifact_shape_of_the_release(traced):
    """What each release logs, pinned: per-source artifacts (2.13, 2.14), or
    one aggregated artifact per compile and per cache hit, and one per source
    outside a scope (2.15)."""
    off, _ = traced
    got = shape(off)
    if not RELEASE.runtime_wrapper_generated:
        assert all(arts == [] for arts in got.values()), got
        return
    if not RELEASE.aggregates_runtime_wrapper_trace:
        assert all(n in OURS for arts in got.values() for n, _ in arts), got
        assert [n for n, _ in got["outside"]] == [
            "output_alias_wrapper", "mutation_epilogue", "runtime_wrapper_orchestration"
        ], got["outside"]
        return
    compile_, cache, outside = got["compile"], got["cache"], got["outside"]
    assert [n for n, _ in compile_ + cache + outside] == [AGGREGATED] * (2 + 2 + 3), got
    assert got["spy"] == [compile_[0]], got
    inference, training = (blocks for _, blocks in compile_)
    assert inference == [
        "output_alias_wrapper", "mutation_epilogue", "runtime_wrapper_orchestration"
    ], inference
    # the factory's sources first (CompiledFunction), then the runtime wrapper's
    assert training[-2:] == ["output_alias_wrapper", "runtime_wrapper_orchestration"], training
    assert "compiled_function_forward" in training[:-2], training
    miss, hit = (blocks for _, blocks in cache)
    assert hit == miss and hit[-1] == "runtime_wrapper_orchestration", cache
    assert [blocks for _, blocks in outside] == [
        ["output_alias_wrapper"], ["mutation_epilogue"], ["runtime_wrapper_orchestration"]
    ], outside


def test_nothing_built_when_tracing_is_off(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("plan described with tracing off")

    from torch._logging._internal import trace_log

    monkeypatch.setattr(trace_log, "handlers", [])  # what TORCH_TRACE unset leaves
    monkeypatch.setattr(_trace, "describe", boom)
    before = torch_aot_rt.stats()["runtime_wrappers"]
    with torch_aot_rt.enabled(True):
        g = aot_function(lambda x: (x * 2, x.view(-1)), fw_compiler=nop)
        g(torch.randn(3))
    assert torch_aot_rt.stats()["runtime_wrappers"] > before


@pytest.mark.skipif(
    RELEASE is None or not RELEASE.aggregates_runtime_wrapper_trace,
    reason="runtime-wrapper sources aggregate from 2.15 on",
)
def test_plan_text_in_the_sink_is_formatted_lazily(monkeypatch):
    """2.15: inside an aggregation scope, the sink gets (name, PlanText)
    entries where upstream's get (name, source), and the scope hands them to
    codegen's _trace_runtime_wrapper_sources at its end: the text is built
    only when the artifact is formatted, and formats as describe() does."""
    from torch._functorch._aot_autograd import codegen

    calls, handed = [], []
    describe = _trace.describe
    monkeypatch.setattr(_trace, "describe", lambda plan, name: calls.append(name) or
                        describe(plan, name))
    monkeypatch.setattr(codegen, "_trace_runtime_wrapper_sources", handed.append)
    with torch_aot_rt.enabled(True):
        aot_function(lambda x: (x * 2, x.view(-1)), fw_compiler=nop)(torch.randn(3))
    (sources,) = handed  # one scope: the compile's
    ours = [(n, t) for n, t in sources if isinstance(t, _trace.PlanText)]
    assert [n for n, _ in ours] == ["output_alias_wrapper", "runtime_wrapper_orchestration"]
    assert calls == []
    text = codegen._format_runtime_wrapper_sources(sources)
    assert calls == ["output_alias_wrapper", "runtime_wrapper_orchestration"]
    assert [b for b, _ in split_blocks(text)] == [n for n, _ in sources]
    assert split_blocks(text)[-1][1] == describe(ours[-1][1].plan, "runtime_wrapper_orchestration")
