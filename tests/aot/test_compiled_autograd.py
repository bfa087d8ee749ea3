"""Compiled autograd (torch._dynamo.compiled_autograd) over CompiledFunction
nodes: upstream's PyNode, or the C++ node (csrc/cpp/compiled_node_compiled_
autograd.cpp) where the C++ part is loaded.

Each program runs with the C runtime off, then on, from the same seed; the
two runs must agree bit for bit on the gradients and on every other value
the program returns, on the graph compiled autograd traced (its code, the
AOT ids of the two runs numbered alike), and on compiled autograd's counts
(captures: compiles and recompiles); the run with the C runtime on must
have taken the C++ node for every CompiledFunction call when the C++ part
is loaded. Compiled autograd is enabled each way a program can: around the
forward and the backward, around the backward alone (after a forward that
built the node), and through ``torch._dynamo.config.compiled_autograd``
with the backward inside a compiled region.
"""

from __future__ import annotations

import re

import pytest
import torch

import _differential as D
import _training as T

pytestmark = pytest.mark.needs_c

HOWS = ("around", "backward_only", "config")


def _normalize(code: str) -> str:
    # AOT ids count every compile of the process: number them in order of
    # appearance so that the two runs compare
    ids: dict[str, str] = {}
    return re.sub(r"aot(\d+)", lambda m: "aot" + ids.setdefault(m.group(1), str(len(ids))), code)


class _Capture:
    """A compiled-autograd compiler that keeps the code of each graph it is
    given, then compiles it with aot_eager."""

    def __init__(self):
        self.graphs: list[str] = []

    def __call__(self, gm):
        self.graphs.append(_normalize(gm.code))
        return torch.compile(gm, backend="aot_eager")


def _run(program, use_c, how):
    from torch._dynamo import compiled_autograd
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    capture = _Capture()
    before = T.node_stats()
    with T.c_runtime(use_c):
        if how == "config":
            with torch._dynamo.config.patch(compiled_autograd=True):
                observed = program(None, how)
        else:
            observed = program(lambda: compiled_autograd._enable(capture), how)
    return {
        "observed": observed,
        "graphs": capture.graphs,
        "compiled_autograd": dict(counters["compiled_autograd"]),
        "unique_graphs": counters["stats"]["unique_graphs"],
    }, T.node_stats_delta(before)


def differential(program, how, *, min_taken=1):
    """``program(enable, how)`` off and on; returns the runs' records."""
    off, _ = _run(program, False, how)
    on, delta = _run(program, True, how)
    D.assert_same(off, on)
    if T.cpp_node_in_use():
        assert delta.get("taken", 0) >= min_taken and set(delta) == {"taken"}, delta
    assert off["compiled_autograd"].get("captures"), off
    if how != "config":
        assert off["graphs"], off
    return off


def _values(xs):
    return [D.TensorValue(x) if isinstance(x, torch.Tensor) else x for x in xs]


def _grads(module):
    return [D.TensorValue(p.grad) if p.grad is not None else None for p in module.parameters()]


def _training_steps(make_module, make_inputs, steps=3, *, retain=False, dynamic=None):
    """A program: ``steps`` training steps of a compiled module; compiled
    autograd enabled as ``how`` says."""

    def program(enable, how):
        module = make_module()
        cm = torch.compile(module, backend="aot_eager", dynamic=dynamic)
        compiled_step = torch.compile(_step, backend="aot_eager")
        seen = []
        for step in range(steps):
            x = make_inputs(step)

            def backward(loss):
                loss.backward(retain_graph=retain)
                if retain:
                    loss.backward()

            if how == "around":
                with enable():
                    loss = cm(x).pow(2).sum()
                    backward(loss)
            elif how == "backward_only":
                loss = cm(x).pow(2).sum()
                with enable():
                    backward(loss)
            else:  # config: the backward inside a compiled region
                loss = compiled_step(cm, x, backward)
            seen.append(_values([loss.detach(), *[b for b in module.buffers()]]) + _grads(module))
            module.zero_grad()
        return seen

    return program


def _step(cm, x, backward):
    loss = cm(x).pow(2).sum()
    backward(loss)
    return loss


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def with_batchnorm():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))


class TwoGraphs(torch.nn.Module):
    """A graph break in the forward: two CompiledFunction nodes in one
    backward."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = self.a(x).tanh()
        torch._dynamo.graph_break()
        return self.b(y)


def batch(step):
    return torch.randn(4, 8)


@pytest.mark.parametrize("how", HOWS)
def test_mlp(how):
    differential(_training_steps(mlp, batch), how, min_taken=3)


@pytest.mark.parametrize("how", HOWS)
def test_batchnorm(how):
    """BatchNorm in training mode: running statistics mutated by the graph
    (the runtime wrapper's input mutations), a buffer saved for backward."""
    differential(_training_steps(with_batchnorm, batch), how, min_taken=3)


@pytest.mark.parametrize("how", ("around", "backward_only"))
def test_graph_break(how):
    differential(_training_steps(TwoGraphs, batch), how, min_taken=6)


@pytest.mark.parametrize("how", ("around", "backward_only"))
def test_dynamic_shapes(how):
    """The batch size changes every step: symbolic sizes saved for backward
    (the key's symints, lifted as dynamic), compiled autograd's recompiles."""
    program = _training_steps(mlp, lambda step: torch.randn(3 + step, 8), steps=4)
    r = differential(program, how, min_taken=4)
    assert len(r["graphs"]) >= 2, r["graphs"]


@pytest.mark.parametrize("how", ("around", "backward_only"))
def test_retain_graph(how):
    """Two backwards of one graph (retain_graph=True, then without): the
    saved tensors survive the first and the node releases them after the
    second."""
    differential(_training_steps(mlp, batch, retain=True), how, min_taken=3)


def test_backward_twice_error():
    """A second backward through a graph whose saved tensors compiled
    autograd released: the same error."""

    def program(enable, how):
        cm = torch.compile(mlp(), backend="aot_eager")
        loss = cm(batch(0)).sum()
        with enable():
            loss.backward()
            return T._safe(loss.backward)

    r = differential(program, "backward_only")
    assert r["observed"]["type"] == "RuntimeError", r["observed"]


def test_no_grad_forward():
    """A forward without grad (inference: no node) and one with grad, both
    under compiled autograd."""

    def program(enable, how):
        module = mlp()
        cm = torch.compile(module, backend="aot_eager")
        x = batch(0)
        with enable():
            with torch.no_grad():
                y0 = cm(x)
            with torch.inference_mode():
                y1 = cm(x)
            loss = cm(x).sum()
            loss.backward()
        return _values([y0, y1, loss.detach()]) + _grads(module)

    differential(program, "around")


def test_backward_saved_by_the_cache_error():
    """A CompiledFunction without its lazy-backward info (what
    AOTAutogradCache loads): compiled autograd refuses it with upstream's
    error (its set_node_origin's), on the C++ node as on upstream's."""

    def program(enable, how):
        cm = torch.compile(mlp(), backend="aot_eager")
        loss = cm(batch(0)).sum()
        (cls,) = T.compiled_function_classes([loss])
        cls._lazy_backward_info = None
        with enable():
            return T._safe(loss.backward)

    off, _ = _run(program, False, "backward_only")
    on, delta = _run(program, True, "backward_only")
    D.assert_same(off, on)
    assert off["observed"]["type"] == "RuntimeError", off
    assert "AOTAutogradCache" in off["observed"]["message"], off
    if T.cpp_node_in_use():
        assert delta == {"taken": 1}, delta


def test_no_leak_over_many_backwards():
    """Compiled autograd's cache hits over many steps (compiled_args on the
    node every backward, the face and its BackwardState-less state as hooks
    of the graph): reference counts of the parameters and the number of live
    tensors and grad_fn objects stay flat."""
    import gc
    import sys
    import warnings

    from torch._dynamo import compiled_autograd

    torch._dynamo.reset()
    torch.manual_seed(0)
    module = mlp()
    with T.c_runtime(True):
        cm = torch.compile(module, backend="aot_eager")
        x = batch(0)

        def step():
            loss = cm(x).sum()
            with compiled_autograd._enable(torch.compile(backend="eager")):
                loss.backward()
            module.zero_grad(set_to_none=True)

        def live():
            gc.collect()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                objs = gc.get_objects()
            return (sum(1 for o in objs if isinstance(o, torch.Tensor)),
                    sum(1 for o in objs if type(o).__name__ == "CompiledFunctionBackward"),
                    [sys.getrefcount(p) for p in module.parameters()])

        for _ in range(3):
            step()
        before = live()
        for _ in range(200):
            step()
        after = live()
    # (other tests' garbage may die meanwhile: never more than before)
    assert after[0] <= before[0] + 2 and after[1] <= before[1], (before, after)
    assert after[2] == before[2], (before, after)
