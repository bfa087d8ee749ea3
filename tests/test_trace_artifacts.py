"""Structured-trace artifacts (TORCH_TRACE / tlparse) for the C runtime
wrapper (torch_aot_rt/_trace.py).

A program run once with the C runtime off and once on, each in a subprocess
with TORCH_TRACE set: the same runtime-wrapper artifact names, in the same
order (output_alias_wrapper and mutation_epilogue where the graph has them, then
runtime_wrapper_orchestration), and the C ones describe the C
plan (mutations, alias regeneration, detaches, grad mode). With tracing off,
no description is built.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from functorch.compile import aot_function, nop

import torch_aot_rt
from torch_aot_rt import _trace

pytestmark = pytest.mark.needs_c

NAMES = ("runtime_wrapper_orchestration", "output_alias_wrapper", "mutation_epilogue")

PROGRAM = r'''
import torch
import torch_aot_rt  # noqa: F401 (TORCH_AOT_RT decides whether it acts)
from functorch.compile import aot_function, nop

def inference_mutation(x, buf):
    buf.add_(1)  # aot_function: applied by the runtime epilogue
    return x * 2, x.view(-1)

def training_alias(x, w):
    y = x * w
    return y, y.view(-1), x.t()

aot_function(inference_mutation, fw_compiler=nop)(torch.randn(2, 3), torch.zeros(2, 3))
torch.compile(training_alias, backend="aot_eager")(
    torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True))
'''


def read_artifacts(trace_dir):
    """[(name, payload)] of the runtime-wrapper artifacts, in log order."""
    out = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "*"))):
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            start = line.find("{")
            if start < 0 or '"artifact"' not in line:
                continue
            meta = json.loads(line[start:])
            name = meta["artifact"]["name"]
            if name not in NAMES:
                continue
            payload = []
            for more in lines[i + 1:]:
                if not more.startswith("\t"):
                    break
                payload.append(more[1:])
            out.append((name, "\n".join(payload)))
    return out


def run_traced(tmp_path, c_on: bool):
    trace_dir = tmp_path / ("on" if c_on else "off")
    trace_dir.mkdir()
    env = dict(os.environ, TORCH_TRACE=str(trace_dir), TORCH_AOT_RT="1" if c_on else "0")
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, timeout=600)
    return read_artifacts(str(trace_dir))


def test_same_artifacts_and_c_plan_described(tmp_path):
    off = run_traced(tmp_path, False)
    on = run_traced(tmp_path, True)
    assert [n for n, _ in off], "upstream logged no runtime-wrapper artifact"
    assert [n for n, _ in on] == [n for n, _ in off]
    for name, payload in on:
        assert payload.startswith(_trace.HEADER), payload
        assert f"# artifact: {name}" in payload
    orch = [p for n, p in on if n == "runtime_wrapper_orchestration"]
    assert len(orch) == 2
    inference, training = orch
    assert "inference: grad mode off" in inference
    assert "mutation epilogue (1 mutated inputs)" in inference
    assert ".copy_(updated[0])" in inference
    assert "training: grad mode on and view replay on" in training
    assert "regenerated from graph output" in training or "regenerated from input" in training
    for name, payload in off:  # upstream's are its Python source
        assert not payload.startswith(_trace.HEADER)
        assert "def " in payload


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
