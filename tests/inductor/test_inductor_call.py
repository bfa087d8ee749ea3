"""Inductor's per-call layer, ``CompiledFxGraph.__call__``, in C
(``_C.GraphCall``, csrc/inductor/graph_call.c), against upstream's: the same
program with the C runtime off (the class's __call__ then runs upstream's)
and on, compared: results and gradients, the profiler's events, the graph
execution order inductor's debug recording keeps, the runtime metrics the
call finishes, an exception inside the graph, a graph with no current
callable; and which path each call took.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.utils as dynamo_utils
import torch._inductor.debug as inductor_debug
from torch._inductor.output_code import CompiledFxGraph

import _differential as D
import torch_aot_rt

pytestmark = [pytest.mark.needs_c, pytest.mark.inductor]


def _check_in_c() -> None:
    """__call__ is the C one."""
    call = CompiledFxGraph.__dict__["__call__"]
    assert isinstance(call, torch_aot_rt._C.GraphCall), (
        call, torch_aot_rt.stats()["fallback_reasons"])


UPSTREAM_OFF = "upstream calls: compiled with the C runtime off, or other arguments"


def _counts():
    return torch_aot_rt.stats()["inductor_graph_call"]


def _run(use_c, program):
    torch._dynamo.reset()
    torch.manual_seed(0)
    before = _counts()
    with D.runtime(use_c):
        out = program()
    after = _counts()
    return out, {k: v - before[k] for k, v in after.items() if v != before[k]}


def differential(program, *, expect_on=None):
    """``program()`` off, then on: the same observations; the on run's
    calls by path (``expect_on``)."""
    _check_in_c()
    off, off_counts = _run(False, program)
    on, on_counts = _run(True, program)
    D.assert_same(off, on)
    assert set(off_counts) <= {UPSTREAM_OFF}, off_counts
    if expect_on is not None:
        assert on_counts == expect_on, on_counts
    return off


def f(x, w):
    return (x @ w).relu() * 2


def _compiled(requires_grad=False):
    g = torch.compile(f, backend="inductor")
    x = torch.randn(3, 4)
    w = torch.randn(4, 5, requires_grad=requires_grad)
    return g, x, w


def test_calls_in_c():
    """Inference: the first call runs upstream's (the graph still holds its
    compile context on 2.13 on), every later one C; training: forward and
    backward graphs alike; results and gradients upstream's."""

    def program():
        g, x, w = _compiled()
        outs = [D.TensorValue(g(x, w)) for _ in range(4)]
        g2, x2, w2 = _compiled(requires_grad=True)
        grads = []
        for _ in range(3):
            g2(x2, w2).sum().backward()
            grads.append(D.TensorValue(w2.grad))
            w2.grad = None
        return outs, grads

    differential(program)
    counts = _run(True, program)[1]
    assert counts.get("calls in C", 0) >= 6, counts


def test_profiler_range():
    """Under the profiler upstream's __call__ runs (its range names the
    graph's cache key): the same "## Call CompiledFxGraph ... ##" events."""

    def program():
        g, x, w = _compiled()
        g(x, w)
        with torch.profiler.profile() as prof:
            out = g(x, w)
        names = [e.name.startswith("## Call CompiledFxGraph") for e in prof.events()
                 if "CompiledFxGraph" in e.name]
        return D.TensorValue(out), names

    r = differential(program)
    assert r[1] == [True], r


def test_graph_execution_order():
    """inductor's debug recording (record_and_log_graph_execution_order):
    upstream's __call__ appends each call's compile id."""

    def program():
        g, x, w = _compiled()
        g(x, w)
        with inductor_debug.record_and_log_graph_execution_order():
            g(x, w)
            g(x, w)
            order = list(inductor_debug.GRAPH_EXECUTION_ORDER)
        return len(order), [sorted(e) for e in order]

    r = differential(program)
    assert r[0] == 2, r


def test_runtime_metrics_finished():
    """A runtime metric recorded before a call is finished by it (on_exit
    called, the metrics reset), C or upstream."""

    def program():
        g, x, w = _compiled()
        g(x, w)
        ctx = dynamo_utils.get_runtime_metrics_context()
        seen = []
        on_exit = ctx._on_exit
        ctx._on_exit = lambda start, end, metrics, exc_type, exc: seen.append(dict(metrics))
        try:
            ctx.increment("torch_aot_rt_test_metric", 3)
            g(x, w)
            left = dict(ctx._metrics)
        finally:
            ctx._on_exit = on_exit
        return seen, left

    r = differential(program)
    assert r[0] == [{"torch_aot_rt_test_metric": 3}] and r[1] == {}, r


def test_exception_inside_the_graph():
    """The graph raises (its current callable does): the same exception,
    the metrics still finished."""

    def program():
        g, x, w, graph = _compiled_graph()
        real = graph.current_callable

        def failing(inputs):
            raise ValueError("inside the graph")

        graph.current_callable = failing
        try:
            err = D.error_record(D.raised(lambda: g(x, w)))
        finally:
            graph.current_callable = real
        return err, D.TensorValue(g(x, w))

    r = differential(program)
    assert r[0]["type"] == "ValueError", r


def test_no_current_callable():
    """A graph whose current callable is None: the release's AssertionError."""

    def program():
        g, x, w, graph = _compiled_graph()
        real = graph.current_callable
        graph.current_callable = None
        try:
            return D.error_record(D.raised(lambda: g(x, w)))
        finally:
            graph.current_callable = real

    r = differential(program)
    assert r["type"] == "AssertionError", r


def _graphs():
    import gc

    return [o for o in gc.get_objects() if type(o) is CompiledFxGraph]


def _compiled_graph():
    """A compiled function called once, and the CompiledFxGraph that call
    made (the one the gc did not know before)."""
    known = {id(o) for o in _graphs()}
    g, x, w = _compiled()
    g(x, w)
    (graph,) = [o for o in _graphs() if id(o) not in known and o.current_callable is not None]
    return g, x, w, graph


def test_decided_when_compiled():
    """Which __call__ a graph runs is decided when it is compiled: a graph
    compiled with the C runtime off runs upstream's when called with it on,
    one compiled with it on runs in C when called with it off."""
    _check_in_c()
    torch._dynamo.reset()
    with D.runtime(False):
        g_off, x, w = _compiled()
        g_off(x, w)
    with D.runtime(True):
        g_on = torch.compile(lambda x, w: f(x, w) + 0, backend="inductor")
        g_on(x, w)
    before = _counts()
    with D.runtime(True):
        g_off(x, w)
    with D.runtime(False):
        g_on(x, w)
    after = _counts()
    delta = {k: v - before[k] for k, v in after.items() if v != before[k]}
    assert delta == {UPSTREAM_OFF: 1, "calls in C": 1}, delta
