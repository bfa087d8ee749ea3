"""The C CompiledFunction under functorch transforms (grad, vmap, vjp, jvp),
compiled autograd, BackwardState and AOTAutogradCache, and with
functorch.config.debug_assert, C runtime off vs on.
"""

from __future__ import annotations

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import torch_aot_rt
import _training as T
from _training import differential, leaf

from _autograd_programs import CASES, f_plain


# ---------------------------------------------------------------------------
# functorch transforms


def _transform_calls(g):
    return {
        "grad": lambda: torch.func.grad(lambda x: g(x, torch.ones(3)).sum())(torch.randn(3)),
        "vmap": lambda: torch.func.vmap(lambda x: g(x, torch.ones(3)))(torch.randn(2, 3)),
        "vjp": lambda: torch.func.vjp(lambda x: g(x, torch.ones(3)), torch.randn(3)),
        "jvp": lambda: torch.func.jvp(
            lambda x: g(x, torch.ones(3)), (torch.randn(3),), (torch.randn(3),)
        ),
    }


def f_vec(x, w):
    return x.sin() * w


@pytest.mark.parametrize("transform", ["grad", "vmap", "vjp", "jvp"])
def test_functorch_transforms(transform):
    """A compiled function (training graph) called inside a functorch
    transform: FunctionApply hands it to upstream's Function.apply; the same
    result or error."""
    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_vec, fw_compiler=nop, bw_compiler=nop)
            out = g(leaf(3), leaf(3))
        T.check_classes(out, use_c, expect=1)
        torch.manual_seed(0)
        r = T._safe(_transform_calls(g)[transform])
        seen[use_c] = repr(r) if not isinstance(r, dict) else r
        assert D.tls_state() == D.tls_state()
    assert seen[False] == seen[True], seen


def test_grads_batched():
    """``torch.autograd.grad(..., is_grads_batched=True)``."""

    def run(outs, inputs):
        out = outs[0]
        v = torch.randn(2, *out.shape)
        return torch.autograd.grad(out, inputs.args, grad_outputs=v, is_grads_batched=True)

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def dead_wrapper(*shape):
    """A functorch wrapper tensor that escaped its (finished) transform."""
    leaked = []

    def h(t):
        leaked.append(t)
        return (t * 2).sum()

    torch.func.grad(h)(torch.randn(*shape))
    assert torch._C._functorch.is_functorch_wrapped_tensor(leaked[0])
    return leaked[0]


def test_dead_functorch_wrapper_input():
    """An argument that is a dead functorch wrapper: Function.apply unwraps
    it (unwrap_dead_wrappers) before the forward; FunctionApply too (the
    C++ node declines a functorch wrapper and counts it)."""
    before = T.node_stats()
    differential(f_plain, lambda: (dead_wrapper(3, 4), leaf(3, 4)), cpp_node=False)
    if T.cpp_node_in_use():
        declined = T.node_stats_delta(before)
        assert declined == {"tensor subclass, functorch, functional or nested input": 2}, declined


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_backward_inside_transform(transform):
    """The compiled backward run inside a functorch transform (forward
    outside): upstream's prologue check raises; the same in C."""

    def run(outs, inputs):
        out, x = outs[0], inputs.args[0]

        def inner(v):
            (gx,) = torch.autograd.grad(out, x, grad_outputs=v, retain_graph=True)
            return gx.sum()

        if transform == "grad":
            return torch.func.grad(inner)(torch.ones(3, 4))
        return torch.func.vmap(inner)(torch.ones(2, 3, 4))

    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run,
        backward_error="RuntimeError",
    )
    bw = on.calls[0]["outputs"]["items"]["backward"]["items"]["message"]["value"]
    assert "within vmap/grad/vjp" in bw, bw


# ---------------------------------------------------------------------------
# compiled autograd, BackwardState, AOTAutogradCache


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_autograd(dynamic):
    """A training step compiled with aot_eager, its backward captured by
    compiled autograd (which reads the class' _lazy_backward_info, metadata,
    _bw_prologue_fn, ... and ctx.symints): the same grads, same captures.
    ``dynamic``: the batch size changes (saved symints in the key)."""
    from torch._dynamo import compiled_autograd
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model0 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 4)
    results = {}
    for use_c in (False, True):
        import copy

        torch._dynamo.reset()
        counters.clear()
        model = copy.deepcopy(model0)
        with T.c_runtime(use_c):
            cm = torch.compile(model, backend="aot_eager", dynamic=dynamic)
            with compiled_autograd._enable(torch.compile(backend="aot_eager")):
                grads = []
                for step in range(3):
                    model.zero_grad()
                    xs = x[: 5 - step] if dynamic else x
                    loss = cm(xs).pow(2).sum()
                    loss.backward()
                    grads.append([p.grad.clone() for p in model.parameters()])
        results[use_c] = (grads, dict(counters["compiled_autograd"]), loss.detach())
    D.assert_same(
        [[D.TensorValue(g) for g in gs] for gs in results[False][0]],
        [[D.TensorValue(g) for g in gs] for gs in results[True][0]],
    )
    assert results[False][1] == results[True][1] and results[True][1].get("captures"), results
    assert torch.equal(results[False][2], results[True][2])


def test_compiled_autograd_backward_state():
    """A hook registered on an intermediate inside the compiled region makes
    AOTAutograd pass a BackwardState (forward: ctx attribute; only compiled
    autograd can run that backward)."""
    from torch._dynamo import compiled_autograd

    def f(x, w):
        y = x * w
        y.register_hook(lambda g: g * 3)
        return (y.sin()).sum()

    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w = leaf(3, 4), leaf(3, 4)
        with T.c_runtime(use_c):
            with compiled_autograd._enable(torch.compile(backend="aot_eager")):
                out = torch.compile(f, backend="aot_eager")(x, w)
                # a BackwardState input: the C++ node keeps it as the ctx does
                classes = T.check_classes(out, use_c, expect=1)
                state = out.grad_fn._compiled_autograd_backward_state
                out.backward()
        results[use_c] = (D.TensorValue(x.grad), D.TensorValue(w.grad), len(classes),
                          type(state).__name__)
    assert results[True][3] == "BackwardState", results
    D.assert_same(results[False], results[True])


@pytest.mark.inductor
def test_autograd_cache_hit_builds_c_class():
    """AOTAutogradCache (inductor): an entry saved by a compile with the C
    runtime off, loaded with it on, builds a C CompiledFunction; loaded with
    it off, upstream's; the same results each time."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    def f(x, w):
        return torch.sin(x @ w).sum(0) * 2

    def step(use_c, expect):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        x, w = torch.randn(3, 4), leaf(4, 5)
        before = torch_aot_rt.stats()["serializable_functions"]
        with T.c_runtime(use_c):
            out = torch.compile(f, backend="inductor")(x, w)
        T.check_classes(out, use_c, expect=1)
        out.sum().backward()
        got = {k: v for k, v in counters["aot_autograd"].items() if "autograd_cache" in k}
        assert got.get(expect) == 1, got
        # a cache hit wraps the result in a SerializableCompiledFunction: with
        # the C path on, ours (the C __call__)
        grew = torch_aot_rt.stats()["serializable_functions"] - before
        if D.C_ENABLED:
            ours = use_c and expect == "autograd_cache_hit"
            assert grew == (1 if ours else 0), grew
        return out.detach(), w.grad

    with torch._functorch.config.patch(enable_autograd_cache=True), \
            torch._inductor.config.patch(fx_graph_cache=True):
        with fresh_cache():
            ref = step(False, "autograd_cache_miss")
            hit_on = step(True, "autograd_cache_hit")
            hit_off = step(False, "autograd_cache_hit")
        # an entry saved from the C path's lazy backward compile
        with fresh_cache():
            miss_on = step(True, "autograd_cache_miss")
            hit_off2 = step(False, "autograd_cache_hit")
            hit_on2 = step(True, "autograd_cache_hit")
    for r in (hit_on, hit_off, miss_on, hit_off2, hit_on2):
        assert torch.equal(r[0], ref[0]) and torch.equal(r[1], ref[1])


# ---------------------------------------------------------------------------
# functorch.config.debug_assert: the C CompiledFunction keeps it


def _debug_assert(flag):
    import torch._functorch.config as functorch_config

    return lambda: functorch_config.patch(debug_assert=flag)


@pytest.mark.parametrize("case", sorted(CASES))
def test_program_with_debug_assert(case):
    """Every program with ``debug_assert=True`` (upstream's own tests force it
    on): the C CompiledFunction is built (no fallback) and observes the same;
    the checks it adds (mutated inputs, aliased outputs) pass as upstream's."""
    fn, make_inputs, backward, check = CASES[case]
    differential(
        fn, make_inputs, backward=backward, bw_compiler_factory=T.RecordingBackward, calls=2,
        config=_debug_assert(True),
    )


@pytest.mark.parametrize("case", ["alias_of_input", "alias_of_intermediate", "data_mutation_requires_grad"])
@pytest.mark.parametrize("compiled_with", [False, True])
def test_debug_assert_switched_after_compile(case, compiled_with):
    """``debug_assert`` is read per forward, as upstream reads it: compiled
    with it one way and called with it the other, the same results."""
    fn, make_inputs, backward, _ = CASES[case]
    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        with T.c_runtime(use_c), _debug_assert(compiled_with)():
            g = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
            g(*D._as_inputs(make_inputs()).args)
        with _debug_assert(not compiled_with)():
            inputs = D._as_inputs(make_inputs())
            seen[use_c] = D.observe_call(
                lambda args: g(*args), inputs
            )
    D.assert_same(seen[False], seen[True], "call")
