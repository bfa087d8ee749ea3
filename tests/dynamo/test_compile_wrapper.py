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
"""

from __future__ import annotations

import inspect
import threading
import warnings

import pytest
import torch
import torch._C._dynamo.eval_frame as c_eval_frame
from torch._dynamo.utils import counters

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c

C_CALL = "calls in C"
MODULE_UPSTREAM = ("OptimizedModule upstream calls: compiled with the C runtime off, a global "
                   "module hook or a helper replaced")


def _counts():
    return torch_aot_rt.stats()["dynamo_compile_wrapper"]


def _check_in_c() -> None:
    """torch.compile returns the C object here."""
    with D.runtime(True):
        f = torch.compile(lambda x: x, backend="eager")
    assert torch_aot_rt._C._is_c_compile_wrapper(f), (
        type(f), torch_aot_rt.stats()["fallback_reasons"])


def _peek(setter, probe):
    """What a C setter of eval_frame's thread-local state holds (it returns
    the prior value), put back."""
    prior = setter(probe)
    setter(prior)
    return repr(prior)


def tls_state():
    state = {
        "callback": repr(c_eval_frame.get_eval_frame_callback()),
        "grad": torch.is_grad_enabled(),
        "include": str(torch._C._dispatch_tls_local_include_set()),
        "exclude": str(torch._C._dispatch_tls_local_exclude_set()),
        "layers": torch._C._functorch.get_dynamic_layer_stack_depth(),
        "skip_guard_eval_unsafe": c_eval_frame.set_skip_guard_eval_unsafe(False),
    }
    # what fullgraph sets around the call: 2.12 on the nested-compile flag
    # and frame count, 2.11 the eval-frame override; 2.13 on the
    # isolate-recompiles id
    for name, probe in (("set_fullgraph_error_on_nested_compile", False),
                        ("set_fullgraph_compiled_frame_count", -1),
                        ("set_eval_frame_isolate_recompiles_id", -1)):
        if hasattr(c_eval_frame, name):
            state[name] = _peek(getattr(c_eval_frame, name), probe)
    if hasattr(c_eval_frame, "set_eval_frame_override"):
        import torch._dynamo.eval_frame as eval_frame

        state["override"] = _peek(c_eval_frame.set_eval_frame_override,
                                  eval_frame._EvalFrameOverride.NONE)
    return state


def _attempt(fn):
    try:
        return {"value": fn()}
    except Exception as e:  # noqa: BLE001 - the error is the observation
        return D.exception_record(e) | {
            "suppress_context": e.__suppress_context__,
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
        }


def _run(use_c, program):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    before = _counts()
    with D.runtime(use_c):
        out = program()
    after = _counts()
    return out, {k: v - before[k] for k, v in after.items() if v != before[k]}


def differential(program, *, min_c=0):
    """``program()`` off, then on: the same observations; the on run's
    calls in C at least ``min_c``."""
    _check_in_c()
    off, off_counts = _run(False, program)
    on, on_counts = _run(True, program)
    D.assert_same(off, on)
    # OptimizedModule.__call__ is the C one for every module: those compiled
    # off run upstream's through it, counted
    assert set(off_counts) <= {MODULE_UPSTREAM}, off_counts
    assert on_counts.get(C_CALL, 0) >= min_c, on_counts
    return off, on_counts


def _v(t):
    return D.TensorValue(t) if isinstance(t, torch.Tensor) else t


def f(x, w):
    return (x * w).sin().sum(0)


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


@pytest.mark.parametrize("how", ["dynamic=True", "dynamic=False", "dynamic_shapes"])
def test_config_patcher_hooks(how):
    """dynamic= (and dynamic_shapes=) add a config patcher to the context's
    enter hooks, entered before the call and reverted after it, also when the
    call raises: calls in C call it as upstream does, and the settings it
    patches read the same inside the compiled function (a graph break) and
    after the call."""
    cfg = torch._dynamo.config
    watched = ("assume_static_by_default", "automatic_dynamic_shapes")
    seen = []

    @torch.compiler.disable
    def peek(x):
        seen.append(tuple(getattr(cfg, k) for k in watched))
        return x

    def h(x, fail):
        y = peek(x.sin())
        if fail:
            raise ValueError("inside")
        return y * 2

    if how == "dynamic_shapes":
        if "dynamic_shapes" not in inspect.signature(torch.compile).parameters:
            pytest.skip("no dynamic_shapes= on this release")
        kwargs = {"dynamic_shapes": {}}
    else:
        kwargs = {"dynamic": how == "dynamic=True"}

    def dirty_state():
        # what the patcher's change/revert mark (2.13 on): the hash and
        # get-dict dirty flags
        hash_var = getattr(cfg, "_hash_dirty_var", None)
        keys_var = getattr(cfg, "_get_dict_dirty_keys_var", None)
        keys = keys_var.get() if keys_var is not None else None
        return (hash_var.get() if hash_var is not None else None,
                sorted(keys) if keys is not None else None)

    def program():
        seen.clear()
        g = torch.compile(h, backend="aot_eager", **kwargs)
        rows = []
        for n, fail in ((3, False), (4, False), (5, True), (6, False)):
            if hasattr(cfg, "_get_dict_dirty_keys_var"):
                # tracking, as after a get_config_copy; the last call starts
                # at the cap, so the patcher's key overflows it
                full = n == 6
                cfg._get_dict_dirty_keys_var.set({f"k{i}" for i in range(16)} if full else set())
                cfg._hash_dirty_var.set(False)
            rows.append(_attempt(lambda: _v(g(torch.randn(n), fail))))
            rows.append((tuple(getattr(cfg, k) for k in watched), dirty_state()))
        return rows, list(seen), dict(counters["stats"])

    (rows, seen_off, _), counts = differential(program, min_c=2)
    assert [r[0] for r in rows[1::2]] == [tuple(getattr(cfg, k) for k in watched)] * 4, rows


def test_config_patcher_with_a_replaced_method(monkeypatch):
    """The config module's own _mark_get_dict_dirty shadowed in its
    __dict__: the patcher's change and revert call that one, C or not."""
    cfg = torch._dynamo.config
    if not hasattr(type(cfg), "_mark_get_dict_dirty"):
        pytest.skip("no _mark_get_dict_dirty on this release")
    calls = []
    original = cfg._mark_get_dict_dirty

    def spy(name):
        calls.append(name)
        return original(name)

    monkeypatch.setitem(cfg.__dict__, "_mark_get_dict_dirty", spy)

    def program():
        calls.clear()
        g = torch.compile(f, backend="aot_eager", dynamic=False)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        outs = [_v(g(x, w)) for _ in range(3)]
        return outs, list(calls)

    (outs, seen), _ = differential(program, min_c=2)
    assert len(seen) >= 8, seen  # two keys, entered and reverted, per call


def test_config_patcher_attribute_from_getattr(monkeypatch):
    """An attribute the patcher reads missing from the config module's
    __dict__ (its hash-dirty variable, 2.13 on): the module's look-up fails
    and the class's __getattr__ runs (it raises, naming the setting), in C
    as in Python; the call raises the same error, and put back, calls work."""
    cfg = torch._dynamo.config
    if "_hash_dirty_var" not in cfg.__dict__:
        pytest.skip("no _hash_dirty_var on this release")

    def program():
        g = torch.compile(f, backend="aot_eager", dynamic=False)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        rows = [_attempt(lambda: _v(g(x, w)))]
        var = cfg.__dict__.pop("_hash_dirty_var")
        try:
            rows.append(_attempt(lambda: _v(g(x, w))))
        finally:
            cfg.__dict__["_hash_dirty_var"] = var
        rows.append(_attempt(lambda: _v(g(x, w))))
        return rows

    r, _ = differential(program, min_c=2)
    assert "value" not in r[1] and "value" in r[2], r


def test_hooks_changed_by_an_enter(monkeypatch):
    """An enter hook's Python (here the user override of a setting the
    dynamic=False patcher sets, a spy: its variable, or on 2.11 its entry's
    attribute assignment) replaces torch.compile's own hook
    and grows the list past what C keeps: the rest of the list is entered as
    upstream's comprehension iterates it, each hook as it is then, and each
    cleanup run in order after the call."""
    cfg = torch._dynamo.config
    from torch._dynamo import eval_frame
    from torch._dynamo.mutation_guard import GenerationTracker

    events, ctxs, armed = [], [], []
    make = eval_frame.make_set_enable_dynamic

    def capture(dynamic):
        ctxs.append(inspect.currentframe().f_back.f_locals["self"])
        return make(dynamic)

    class Hook:  # a callable that is not a function
        def __init__(self, i):
            self.i = i

        def __call__(self):
            events.append(f"enter {self.i}")
            return lambda: events.append(f"exit {self.i}")

    def fire():
        if armed:
            hooks = ctxs[-1].enter_exit_hooks
            armed.clear()
            hooks[1:] = [Hook(i) for i in range(5)]

    class SpyVar:  # the patcher's change calls its set (2.12 on)
        def __init__(self, var):
            self.var = var

        def get(self):
            return self.var.get()

        def set(self, value):
            fire()
            return self.var.set(value)

    entry = cfg._config["assume_static_by_default"]
    monkeypatch.setattr(eval_frame, "make_set_enable_dynamic", capture)
    if hasattr(entry.user_override, "set"):
        monkeypatch.setattr(entry, "user_override", SpyVar(entry.user_override))
    else:
        class SpyEntry(type(entry)):  # 2.11: the change assigns the attribute
            def __setattr__(self, name, value):
                if name == "user_override":
                    fire()
                object.__setattr__(self, name, value)

        monkeypatch.setattr(entry, "__class__", SpyEntry)

    def program():
        ctxs.clear()
        g = torch.compile(f, backend="aot_eager", dynamic=False)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        rows = [_v(g(x, w)), _v(g(x, w))]
        hooks = list(ctxs[-1].enter_exit_hooks)
        events.clear()
        generation = GenerationTracker.generation
        armed.append(True)
        rows.append(_attempt(lambda: _v(g(x, w))))
        rows.append((list(events), GenerationTracker.generation - generation))
        ctxs[-1].enter_exit_hooks[:] = hooks
        rows.append(_v(g(x, w)))
        return rows

    rows, _ = differential(program, min_c=2)
    assert rows[3][0] == [f"enter {i}" for i in range(5)] + [f"exit {i}" for i in range(5)], rows


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


def test_threads():
    """Calls from several threads at once: each thread's results and its
    state after the calls."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        g(x, w)
        results = {}

        def work(k):
            outs = [_v(g(x * k, w)) for _ in range(20)]
            results[k] = (outs, tls_state())

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [results[k] for k in range(4)]

    differential(program, min_c=40)


def test_thread_local_state_is_the_callers():
    """Dynamo's threading.local state is the calling thread's (C keeps each
    local's dict for the thread that called last): a fullgraph call in a
    worker resets and clears only the worker's skip reasons, and (2.14 on) a
    nested-eager depth set in a worker sends only the worker's calls to
    upstream's compile_wrapper, which runs the function eagerly there."""
    from torch._dynamo import eval_frame

    tls = eval_frame.dynamo_tls
    nested = getattr(eval_frame, "_force_eager_nested_compile", None)

    def program():
        g = torch.compile(f, backend="aot_eager", fullgraph=True)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        rows = [_v(g(x, w))]
        tls.skip_reasons = ["main's"]
        results = {}

        def work():
            if nested is not None:
                nested.depth = 1
            outs = [_v(g(x, w)) for _ in range(3)]
            results["worker"] = (outs, getattr(tls, "skip_reasons", "unset"))

        try:
            rows.append(_v(g(x, w)))  # the main thread's dict, remembered
            tls.skip_reasons = ["main's"]
            t = threading.Thread(target=work)
            t.start()
            t.join()
            rows += [results["worker"], tls.skip_reasons, getattr(nested, "depth", None)]
            rows += [_v(g(x, w)), tls.skip_reasons]
        finally:
            tls.skip_reasons = None
        return rows

    off, counts = differential(program, min_c=3)
    if nested is not None:
        # the worker's three calls were upstream's: only the main thread's in C
        assert counts[C_CALL] == 3, counts


def test_threads_taking_turns():
    """Four threads calling one compiled function in turn (C remembers each
    thread's dict of each local): each sees its own thread-local state on
    every call, the one with a nested-eager depth (2.14 on) or fullgraph skip
    reasons of its own included, and the results are upstream's."""
    from torch._dynamo import eval_frame

    tls = eval_frame.dynamo_tls
    nested = getattr(eval_frame, "_force_eager_nested_compile", None)
    n = 4

    def program():
        g = torch.compile(f, backend="aot_eager", fullgraph=True)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        g(x, w)
        turn = [threading.Event() for _ in range(n)]
        seen = {i: [] for i in range(n)}

        def work(i):
            tls.skip_reasons = [f"thread {i}'s"]
            if nested is not None and i == 2:
                nested.depth = 1
            for _ in range(3):
                turn[i].wait()
                turn[i].clear()
                seen[i].append((_v(g(x, w)), getattr(tls, "skip_reasons", "unset"),
                                getattr(nested, "depth", None)))
                turn[(i + 1) % n].set()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        turn[0].set()
        for t in threads:
            t.join()
        return seen

    _, counts = differential(program, min_c=1)
    if nested is not None:
        # thread 2's three calls were upstream's, the others' nine in C
        assert counts[C_CALL] == 1 + 9, counts


def test_context_attribute_set_between_calls():
    """An attribute of the context set between calls (C remembers the ones
    a call reads while the context's dict is unchanged): error_on_graph_break
    set on the context, then put back, is what the next call sets around
    the function, as upstream's reads it on each call."""
    seen = []

    @torch.compiler.disable
    def probe(x):
        seen.append(torch._dynamo.utils._get_error_on_graph_break())
        return x

    def h(x):
        return probe(x + 1) * 2

    def program():
        seen.clear()
        ctx = torch._dynamo.optimize("aot_eager")
        g = ctx(h)
        x = torch.randn(3)
        rows = [_attempt(lambda: _v(g(x))) for _ in range(2)]
        ctx.error_on_graph_break = True
        rows += [_attempt(lambda: _v(g(x))) for _ in range(2)]
        ctx.error_on_graph_break = None
        rows += [_attempt(lambda: _v(g(x))) for _ in range(2)]
        return rows, list(seen)

    r, _ = differential(program, min_c=4)
    assert True in r[1] and r[1][-1] is not True, r


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
