"""Dynamo's compile_wrapper (what torch.compile returns for a function, an
OptimizedModule's forward) in C (upstream's function, whose calls C runs,
csrc/dynamo/compile_wrapper.c), against upstream's: each program compiled
and run with the C runtime off (upstream's closure) and on (the C object),
in one process, compared: results and gradients, recompiles, the errors
(type, message, cause, suppressed context), the thread-local state after
each call (eval-frame callback, grad mode, dispatch include/exclude sets,
the functorch dynamic layer stack, the skip-guard-eval and isolate-recompiles
settings), the stances, fullgraph, error_on_graph_break, export, FX and jit
tracing of a compiled function, generators, threads, the profiler's events,
the structured trace and compilation metrics, torch._dynamo.reset(),
torch.compiler.disable, methods and classes; and which path calls took.

Config patchers and hooks are in test_compile_wrapper_config.py, threads in
test_compile_wrapper_threads.py.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import _differential as D

from _compile_wrapper_runs import (
    C_CALL, _attempt, _check_in_c, _counts, _v, differential, f, tls_state,
)

pytestmark = pytest.mark.needs_c


def test_calls_and_state():
    """Steady-state calls run in C; the result, and the thread-local state
    after each call, as upstream's (the first call installs Dynamo's
    nn.Module patch: upstream's)."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        outs, states = [], []
        for _ in range(4):
            outs.append(_v(g(x, w)))
            states.append(tls_state())
        return outs, states, dict(counters["stats"])

    differential(program, min_c=3)


def test_looks_like_the_function():
    """What callers read off what torch.compile returns: its name and
    signature, the original function, _torchdynamo_orig_callable,
    _is_torch_compile, get_compiler_config; binding as a method."""

    def program():
        class A:
            @torch.compile(backend="aot_eager")
            def m(self, x):
                return x + 1

        g = torch.compile(f, backend="aot_eager")
        import copy
        import types

        return {
            "function": isinstance(g, types.FunctionType),
            "copies": copy.copy(g) is g and copy.deepcopy(g) is g,
            "repr": repr(g).split(" at ")[0],
            "name": g.__name__,
            "qualname": g.__qualname__,
            "signature": str(inspect.signature(g)),
            "wrapped": g.__wrapped__ is f,
            "orig": g._torchdynamo_orig_callable is f,
            "is_torch_compile": getattr(g, "_is_torch_compile", None),
            "config": callable(g.get_compiler_config),
            "method": _v(A().m(torch.ones(2))),
        }

    differential(program)


@pytest.mark.parametrize("stance", ["force_eager", "eager_on_recompile", "fail_on_recompile"])
def test_stances(stance):
    """Under a stance the wrapper is upstream's (the stance's callback): the
    same results, recompiles and the fail_on_recompile error."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        first = _v(g(x, w))
        with torch.compiler.set_stance(stance):
            same = _attempt(lambda: _v(g(x, w)))
            other = _attempt(lambda: _v(g(torch.randn(2, 5), torch.randn(2, 5))))
        after = _v(g(x, w))
        return first, same, other, after, dict(counters["stats"]), tls_state()

    differential(program)


def test_skip_guard_eval_unsafe():
    """The skip_guard_eval_unsafe stance: the flag set for the call and
    restored (in C: the stance is "default" with skip_guard_eval_unsafe)."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        g(x, w)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            out = _v(g(x, w))
            inside = tls_state()
        return out, inside, tls_state()

    differential(program)


def test_fullgraph_and_nested_compiled_function():
    """fullgraph=True around a function that calls another compiled
    function: the frame counter and nested-compile flag set and restored;
    a graph break under fullgraph: the same error."""

    inner = torch.compile(lambda x: x.cos() + 1, backend="aot_eager")

    def outer(x):
        return inner(x) * 2

    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    def program():
        g = torch.compile(outer, backend="aot_eager", fullgraph=True)
        x = torch.randn(4)
        outs = [_v(g(x)) for _ in range(3)]
        err = _attempt(lambda: torch.compile(breaks, backend="aot_eager", fullgraph=True)(x))
        return outs, err, tls_state()

    r, _ = differential(program)
    assert "value" not in r[1], r[1]


def test_fullgraph_with_no_compiled_frame():
    """fullgraph=True around a frame Dynamo skips (a dispatch mode is
    active): 2.13 on raise naming the skipped frames; 2.12 warns once
    (torch._dynamo.utils.warn_once); 2.11 counts nothing and returns the
    result. The same error, or the same warning:
    message, category, and the file, line and module it is attributed to
    (compile_wrapper's line of eval_frame.py; a filter on torch._dynamo's
    modules silences it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    import torch._dynamo.utils as dynamo_utils

    def forget_warned():
        getattr(dynamo_utils, "warn_once_cache", set()).clear()

    def call_under_mode(g, x, *filters):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for f in filters:
                warnings.filterwarnings("ignore", module=f)
            with Passthrough():
                out = _attempt(lambda: _v(g(x)))
        return out, [(str(w.message), w.category.__name__, w.filename, w.lineno) for w in seen]

    def program():
        forget_warned()
        g = torch.compile(lambda x: x + 1, backend="eager", fullgraph=True)
        x = torch.ones(2)
        rows = [_v(g(x))]
        # not compared: the first call under the mode makes the disable
        # wrappers torch calls there (their frames are among the skipped)
        call_under_mode(g, x)
        forget_warned()
        rows += [call_under_mode(g, x), call_under_mode(g, x)]
        forget_warned()
        rows.append(call_under_mode(g, x, r"torch\._dynamo\.eval_frame"))
        forget_warned()
        rows.append(call_under_mode(g, x))
        return rows, tls_state()

    (rows, _), _ = differential(program, min_c=5)
    source = inspect.getsource(torch._dynamo.eval_frame._TorchDynamoContext.__call__)
    if "warn_once" in source:  # 2.12
        assert rows[1][1] and not rows[2][1] and not rows[3][1] and rows[4][1], rows
        assert rows[1][1][0][2].endswith("eval_frame.py"), rows[1]
    elif "set_fullgraph_compiled_frame_count" in source:  # 2.13 on
        assert all("no compiled frames" in r[0]["message"] for r in rows[1:]), rows
    else:  # 2.11: no count, the call's result
        assert all("value" in r[0] and not r[1] for r in rows[1:]), rows


def test_error_on_graph_break():
    """torch._dynamo.optimize(..., error_on_graph_break=True): set for the
    call where it differs, restored after; the graph break's error."""

    def breaks(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    def program():
        utils = torch._dynamo.utils
        g = torch._dynamo.optimize("aot_eager", error_on_graph_break=True)(breaks)
        err = _attempt(lambda: g(torch.randn(3)))
        ok = torch._dynamo.optimize("aot_eager", error_on_graph_break=False)(breaks)
        rows = [err, _v(ok(torch.randn(3))), utils._get_error_on_graph_break()]
        # a current value of None is not restored after the call
        utils._set_error_on_graph_break(None)
        try:
            rows += [_v(ok(torch.randn(3))), utils._get_error_on_graph_break()]
        finally:
            utils._set_error_on_graph_break(False)
        return rows

    differential(program)


def test_dynamic_shapes():
    def program():
        g = torch.compile(f, backend="aot_eager")
        outs = [_v(g(torch.randn(n, 4), torch.randn(n, 4))) for n in (2, 3, 4, 5)]
        return outs, dict(counters["stats"])

    differential(program, min_c=1)


def test_exception_inside_the_graph():
    """The compiled function raises at run time: the same exception, and the
    thread-local state as before the call."""

    def h(x, i):
        return x[i] + 1

    def program():
        g = torch.compile(h, backend="aot_eager")
        x = torch.randn(4)
        g(x, torch.tensor([1]))
        before = tls_state()
        err = _attempt(lambda: g(x, torch.tensor([9])))
        return err, before == tls_state()

    r, _ = differential(program)
    assert r[1] and "value" not in r[0], r


@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
def test_dispatch_keys_set_inside_are_restored(raises):
    """Code the compiled function runs outside its graph leaves a key in the
    local dispatch exclude set (and then raises, or not): compile_wrapper
    puts the sets back as they were before the call (2.13: leaving its
    _ForceDispatchKeyGuard; 2.14 on: _dynamo_restore_local_dispatch_key_set),
    with the C++ part a direct force of the saved sets."""
    key = torch._C.DispatchKey.AutocastCPU

    @torch.compiler.disable
    def leak(x):
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)
        if raises:
            raise ValueError("after the leak")
        return x

    def h(x):
        return leak(x.sin()).cos()

    def program():
        g = torch.compile(h, backend="aot_eager")
        x = torch.randn(4)
        seen = []
        try:
            # the compiling call is not compared: what it leaves depends on
            # what this process compiled before (a first compile of h keeps
            # the key, upstream's as well; one after a reset does not)
            _attempt(lambda: g(x))
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
            for _ in range(3):
                before = tls_state()
                seen.append(_attempt(lambda: _v(g(x))))
                seen.append((before == tls_state(),
                             torch._C._dispatch_tls_is_dispatch_key_excluded(key)))
        finally:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        return seen

    seen, _ = differential(program, min_c=2)
    # 2.13 on, compile_wrapper restores them (2.11 and 2.12 leave the key:
    # the differential above compares that too)
    import torch._dynamo.eval_frame as eval_frame

    source = inspect.getsource(eval_frame._TorchDynamoContext.__call__)
    if "_ForceDispatchKeyGuard" in source or "restore_local_dispatch_key_set" in source:
        assert all(ok and not excluded for ok, excluded in seen[1::2]), seen


def test_helper_replaced_between_calls(monkeypatch):
    """An eval_frame helper replaced after calls ran in C (the globals were
    checked and found bound): the next call notices and is upstream's, which
    calls the replacement; put back, calls are C again."""
    import torch._dynamo.eval_frame as eval_frame

    _check_in_c()
    original = eval_frame._maybe_set_eval_frame
    seen = []

    def spy(callback):
        seen.append(callback)
        return original(callback)

    torch._dynamo.reset()
    with D.runtime(True):
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        ref = g(x, w)
        before = _counts()
        g(x, w)
        monkeypatch.setattr(eval_frame, "_maybe_set_eval_frame", spy)
        out = g(x, w)
        monkeypatch.undo()
        g(x, w)
        after = _counts()
    delta = {k: v - before[k] for k, v in after.items() if v != before[k]}
    assert torch.equal(out, ref)
    assert delta == {C_CALL: 2, "upstream calls: eval_frame helpers replaced": 1}, delta
    assert len(seen) >= 1, seen


def test_under_export_fx_and_jit():
    """A compiled function called while torch.export traces, while FX traces
    symbolically, and under torch.jit.trace: upstream's paths (export and FX
    run it inline, jit tracing raises)."""
    inner = None

    class M(torch.nn.Module):
        def forward(self, x):
            return inner(x) + 1

    def program():
        nonlocal inner
        inner = torch.compile(lambda x: x.sin(), backend="aot_eager")
        x = torch.randn(3)
        exported = _attempt(lambda: str(torch.export.export(M(), (x,)).graph_module.code))
        fx = _attempt(lambda: str(torch.fx.symbolic_trace(M()).code))
        jit = _attempt(lambda: torch.jit.trace(M(), (x,)))
        return exported, fx, jit, tls_state()

    differential(program)


def test_generator_and_disable():
    """A compiled generator function; torch.compiler.disable inside a
    compiled function (a graph break to eager)."""

    def gen(x):
        for i in range(3):
            yield x + i

    @torch.compiler.disable
    def eager_part(x):
        return x * 3

    def uses_disabled(x):
        return eager_part(x.sin()) + 1

    def program():
        g = torch.compile(gen, backend="aot_eager")
        items = [_v(t) for t in g(torch.ones(2))]
        h = torch.compile(uses_disabled, backend="aot_eager")
        return items, [_v(h(torch.ones(2))) for _ in range(3)], dict(counters["stats"])

    differential(program)


def test_methods_and_a_class():
    """torch.compile over a method, a staticmethod (2.14 on: its function)
    and a module class (2.15 on: its __call__ and _call_impl; before, the
    class is a callable like any other): results, gradients, errors."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).relu()

    def program():
        class K:
            @torch.compile(backend="aot_eager")
            def method(self, x):
                return x.sin() * 2

            @torch.compile(backend="aot_eager")
            @staticmethod
            def static(x):
                return x.cos() + 1

        cls = torch.compile(type("Compiled", (M,), {}), backend="aot_eager")
        x = torch.randn(2, 4)
        m = _attempt(lambda: cls())
        outs = []
        if "value" in m:
            for _ in range(3):
                y = m["value"](x)
                y.sum().backward()
                outs.append(_v(y))
            outs.append([_v(p.grad) for p in m["value"].parameters()])
        k = K()
        return (
            outs,
            [_v(k.method(x)) for _ in range(3)],
            [_attempt(lambda: _v(K.static(x))) for _ in range(3)],
            _attempt(lambda: _v(k.static(x))),
        )

    differential(program, min_c=3)


def test_profiler_events():
    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        g(x, w)
        with torch.profiler.profile() as prof:
            out = g(x, w)
        names = sorted({e.name for e in prof.events() if not e.name.startswith("aten::")})
        return _v(out), names

    differential(program)


def test_structured_trace_and_metrics():
    """The structured trace (torch._logging's trace log, as TORCH_TRACE
    writes it) and Dynamo's compilation-time metrics over a compile, a
    recompile and steady calls: the same events in the same order, the
    same metric names, each recorded as often."""
    import logging

    from torch._dynamo.utils import compilation_time_metrics
    from torch._logging._internal import trace_log

    class Events(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.names = []

        def emit(self, record):
            meta = getattr(record, "metadata", None)
            name = next(iter(meta)) if isinstance(meta, dict) and meta else None
            if name != "str":  # the process's interning of file names: first use only
                self.names.append(name)

    def program():
        compilation_time_metrics.clear()
        handler = Events()
        trace_log.addHandler(handler)
        try:
            g = torch.compile(f, backend="aot_eager")
            x, w = torch.randn(3, 4), torch.randn(3, 4)
            outs = [_v(g(x, w)) for _ in range(3)]
            outs += [_v(g(torch.randn(5), torch.randn(5))) for _ in range(3)]
        finally:
            trace_log.removeHandler(handler)
        metrics = {k: len(v) for k, v in compilation_time_metrics.items()}
        return outs, handler.names, metrics

    # the process's first compile logs no "dynamo" begin event (the chromium
    # logger's first use): one before both runs
    torch.compile(lambda x: x + 1, backend="aot_eager")(torch.randn(2))
    r, _ = differential(program, min_c=4)
    assert r[1] and r[2], r


def test_reset_and_module():
    """torch._dynamo.reset() between calls (a recompile); an OptimizedModule
    (its forward is a compile_wrapper), with gradients."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        a = _v(g(x, w))
        torch._dynamo.reset()
        b = _v(g(x, w))
        m = torch.nn.Linear(4, 2)
        cm = torch.compile(m, backend="aot_eager")
        for _ in range(3):
            cm(x).sum().backward()
        return a, b, _v(m.weight.grad), dict(counters["stats"]), tls_state()

    _, on_counts = differential(program, min_c=2)
    assert on_counts.get("OptimizedModule calls in C", 0) >= 2, on_counts


def test_module_with_a_global_hook():
    """A global module forward hook: OptimizedModule.__call__ warns and the
    hook fires (twice: the OptimizedModule and the module), upstream's."""
    import warnings

    def program():
        m = torch.nn.Linear(4, 2)
        cm = torch.compile(m, backend="aot_eager")
        x = torch.randn(3, 4)
        cm(x)
        seen = []
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda mod, args, out: seen.append(type(mod).__name__))
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = _v(cm(x))
        finally:
            handle.remove()
        return out, seen, [str(w.message)[:60] for w in caught]

    r, _ = differential(program)
    assert r[1] and r[2], r


@pytest.mark.parametrize("how", ["plain", "fullgraph", "dynamic", "error_on_graph_break",
                                 "raises"])
def test_leaks_nothing_over_many_calls(how):
    """Every path of a call in C (fullgraph's set-up and restore, a config
    patcher's change and revert, error_on_graph_break's, an exception from
    inside) keeps and drops no reference per call: the counts of what the
    call touches are flat over 2,000 calls, and the interpreter's allocated
    blocks grow by less than one per two calls (they move by a few hundred
    either way from Dynamo's own caches, with the C path off too)."""
    import gc
    import sys

    _check_in_c()

    def fn(x, fail):
        if fail:
            raise ValueError("inside")
        return x + 1

    with D.runtime(True):
        if how == "error_on_graph_break":
            g = torch._dynamo.optimize("eager", error_on_graph_break=True)(fn)
        else:
            kwargs = {"fullgraph": {"fullgraph": True}, "dynamic": {"dynamic": False}}
            g = torch.compile(fn, backend="eager", **kwargs.get(how, {}))
    x, fail = torch.ones(2), how == "raises"

    def call():
        try:
            g(x, fail)
        except ValueError:
            pass

    def state():
        gc.collect()
        return (sys.getrefcount(x), sys.getrefcount(g), sys.getrefcount(fn),
                sys.getrefcount(torch._dynamo.config), sys.getallocatedblocks())

    for _ in range(100):
        call()
    before, calls = state(), _counts()[C_CALL]
    for _ in range(2000):
        call()
    after = state()
    assert _counts()[C_CALL] - calls >= 2000
    assert after[:4] == before[:4], (before, after)
    assert after[4] - before[4] < 1000, (before, after)
