"""References, memory and threads, with the C runtime on (upstream's when
``TORCH_AOT_RT=0``): reference counts of inputs, outputs and the objects a
wrapper holds stay flat over many calls; an input whose only reference is the
args list dies when the compiled function clears that list exactly when it
does upstream; calls from several threads give correct results and leave each
thread's grad mode and view-replay state alone.
"""

from __future__ import annotations

import contextvars
import gc
import sys
import threading
import warnings
import weakref

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
from _cases import f_plain


def f_mut_alias(a, b):
    a.mul_(1.0001)
    y = a * b
    return a.view(-1), y, y.t(), b, 3


def _compiled(fn, *first_args):
    """aot_function(fn) with the C runtime, compiled by a first call."""
    with D.runtime(True), D.WrapperSpy() as spy:
        g = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        first = g(*first_args)
    return g, [r["result"] for r in spy.records], first


def _live_tensors():
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on deprecated torch objects warns
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_refcounts_flat_over_many_calls(device, training):
    # in training, b requires grad; a (mutated every call) does not
    a = torch.randn(3, 4, device=device)
    b = torch.randn(3, 4, device=device, requires_grad=training)
    g, wrappers, outs = _compiled(f_mut_alias, a, b)
    for _ in range(5):  # first invocation done; warm caches
        if training:
            sum(o.sum() for o in outs[:3]).backward()
        outs = g(a, b)
    del outs
    (wrapper,) = wrappers
    assert wrapper is not None
    if D.C_ENABLED:
        assert D.is_c_wrapper(wrapper)

    def counts():
        return (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(wrapper))

    before = counts()
    tensors_before = _live_tensors()
    out_refcounts = []
    n = 300 if training else 1000
    for i in range(n):
        outs = g(a, b)
        if i in (10, n - 1):
            out_refcounts.append([sys.getrefcount(o) for o in outs if isinstance(o, torch.Tensor)])
        if training and i % 10 == 0:
            sum(o.sum() for o in outs[:3]).backward()
        del outs
    assert counts() == before
    assert out_refcounts[0] == out_refcounts[1]
    assert _live_tensors() <= tensors_before + 2


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_refcounts_of_passed_through_objects(device, training):
    """A non-tensor object the compiled function returns, and the compiled
    function itself, are not leaked by calls (direct route)."""
    sentinel = object()
    real_fn, kwargs = D.capture_wrapper_kwargs(
        f_plain,
        [torch.randn(3, device=device, requires_grad=training), torch.randn(3, device=device)],
    )

    def compiled(args):
        return [args[0] * args[1]]

    compiled._boxed_call = True
    up, ours = D.build_pair(compiled, kwargs)
    for w in (up, ours):
        for _ in range(3):
            w([torch.randn(3, device=device), torch.randn(3, device=device)])
        before = (sys.getrefcount(sentinel), sys.getrefcount(compiled), sys.getrefcount(w))
        x = torch.randn(3, device=device)
        args_refs = sys.getrefcount(x)
        for _ in range(1000):
            res = w([x, x])
            assert len(res) == 1
            del res
            try:
                w([x])  # too short: an IndexError/TypeError path
            except Exception:  # noqa: BLE001
                pass
        assert (sys.getrefcount(sentinel), sys.getrefcount(compiled), sys.getrefcount(w)) == before
        assert sys.getrefcount(x) == args_refs


def f_mut(a, b):
    a.add_(1)
    return a * b


def f_alias(a, b):
    return a.view(-1), a * b


@pytest.mark.parametrize(
    "fn,training",
    [(f_plain, False), (f_mut, False), (f_alias, False), (f_plain, True), (f_alias, True)],
    ids=["inference", "inference_mutated", "inference_aliased", "training", "training_aliased"],
)
def test_input_freed_when_args_cleared(device, fn, training):
    """The compiled function clears the args list (steal_args), then checks
    whether the first input is still alive. Upstream keeps it alive exactly
    when something else holds it (a captured mutated/aliased input, the
    training path's copy of the list); the C wrapper must agree."""
    real_fn, kwargs = D.capture_wrapper_kwargs(
        fn,
        [
            torch.randn(3, device=device, requires_grad=training).clone()
            if fn is f_mut
            else torch.randn(3, device=device, requires_grad=training),
            torch.randn(3, device=device),
        ],
    )
    n_out = len(kwargs["runtime_metadata"].output_info)
    n_mut = kwargs["runtime_metadata"].num_mutated_inp_runtime_indices
    probe = {}

    def compiled(args):
        out = args[0] * args[1]
        first = args[0]
        outs = [first] * n_mut + [out.view(-1) if n_out == 2 else out] + [out] * (n_out - 1)
        del first
        outs = [o.detach().clone() if i < n_mut else o for i, o in enumerate(outs)]
        args.clear()
        gc.collect()
        probe["alive"] = probe["ref"]() is not None
        return outs

    compiled._boxed_call = True
    up, ours = D.build_pair(compiled, kwargs)
    alive = []
    for w in (up, ours):
        args = [torch.randn(3, device=device), torch.randn(3, device=device)]
        probe["ref"] = weakref.ref(args[0])
        try:
            w(args)
        except Exception as e:  # noqa: BLE001 - compare the outcome
            alive.append(("error", type(e).__name__, str(e)))
            continue
        alive.append(probe["alive"])
        del args
    assert alive[0] == alive[1], alive
    if fn is f_plain and not training:
        assert alive[0] is False  # the case does exercise early freeing


def test_outputs_die_with_their_last_reference(device):
    a, b = torch.randn(3, 4, device=device), torch.randn(3, 4, device=device)
    g, _, _ = _compiled(f_mut_alias, a, b)
    outs = g(a, b)
    refs = [weakref.ref(o) for o in outs if isinstance(o, torch.Tensor) and o is not b]
    del outs
    gc.collect()
    assert all(r() is None for r in refs)


# ---------------------------------------------------------------------------
# threads


def f_thread(a, b):
    a.mul_(2)
    y = (a + b).sin()
    return y, y.t(), a.view(-1)


def test_threads(device):
    """4 threads x 200 calls of a training and an inference wrapper; each
    thread runs with its own grad mode (and view replay for one of them)."""
    base = torch.randn(3, 4, device=device, requires_grad=True)
    # compiled in this thread
    g_train, w_t, _ = _compiled(f_thread, base.clone(), torch.randn(3, 4, device=device))
    g_inf, w_i, _ = _compiled(
        f_thread, torch.randn(3, 4, device=device), torch.randn(3, 4, device=device)
    )
    if D.C_ENABLED:
        assert all(D.is_c_wrapper(w) for w in w_t + w_i)

    errors: list = []
    start = threading.Barrier(4)

    def worker(k):
        try:
            torch.set_grad_enabled(k % 2 == 0)
            torch._C._set_view_replay_enabled(k == 3)
            grad, replay = torch.is_grad_enabled(), torch._C._is_view_replay_enabled()
            gen = torch.Generator(device=device).manual_seed(k)
            start.wait()
            for i in range(200):
                x0 = torch.randn(3, 4, device=device, generator=gen)
                b = torch.randn(3, 4, device=device, generator=gen)
                training = i % 2 == 0
                leaf = x0.clone().requires_grad_(training)
                x = leaf.clone() if training else leaf
                y, yt, av = (g_train if training else g_inf)(x, b)
                expected = (x0 * 2 + b).sin()
                if not torch.equal(y.detach(), expected) or not torch.equal(yt.detach(), expected.t()):
                    errors.append((k, i, "values"))
                if not torch.equal(x.detach(), x0 * 2) or av._base is not x:
                    errors.append((k, i, "mutation or alias"))
                if (torch.is_grad_enabled(), torch._C._is_view_replay_enabled()) != (grad, replay):
                    errors.append((k, i, "thread state"))
                if training and grad:
                    if not y.requires_grad:
                        errors.append((k, i, "requires_grad"))
                    y.sum().backward()
                    if not torch.equal(leaf.grad, 2 * (x0 * 2 + b).cos()):
                        errors.append((k, i, "grad"))
        except Exception as e:  # noqa: BLE001
            errors.append((k, "exception", repr(e)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:10]


def test_first_invocation_check_once_across_threads():
    """Four threads make the first calls of a fresh wrapper at once: the
    custom-op aliasing check runs exactly once in all (as upstream's
    _FirstInvocationContext hands it out once), and no thread is left with
    the check mode on its dispatch stack."""
    from test_features import f_bad_custom_op

    results = {}
    for use_c in (False, True):
        with D.runtime(use_c):
            g = aot_function(f_bad_custom_op, fw_compiler=nop, bw_compiler=nop)
            # compile without running the check: it is spent only on a call
            with torch._functorch.config.patch(check_custom_op_aliasing=False):
                g(torch.randn(3, 4))
        outcomes = []
        start = threading.Barrier(4)

        def worker():
            start.wait()
            try:
                g(torch.randn(3, 4))
                outcomes.append(("ok", torch._C._len_torch_dispatch_stack()))
            except RuntimeError as e:
                outcomes.append(("error" if "custom operator" in str(e) else repr(e),
                                 torch._C._len_torch_dispatch_stack()))

        # torch's config values are per thread (ContextVars) from 2.12: each
        # thread runs in a copy of this context, where the check raises (2.11's
        # are global: the patch stays on while the threads run)
        with torch._functorch.config.patch(error_on_custom_op_aliasing=True):
            threads = [
                threading.Thread(target=contextvars.copy_context().run, args=(worker,))
                for _ in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
        results[use_c] = sorted(outcomes)
    assert results[False] == results[True] == [("error", 0)] + [("ok", 0)] * 3, results


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_refcounts_flat_on_error_paths(device, training):
    """Calls that fail after the inputs were captured (the graph raises, or
    returns too few outputs, or an update cannot be copied back) release
    everything they took."""
    real_fn, kwargs = D.capture_wrapper_kwargs(
        f_mut, [torch.randn(3, device=device, requires_grad=training).clone(), torch.randn(3, device=device)]
    )
    assert kwargs["runtime_metadata"].num_mutated_inp_runtime_indices == 1
    failure = {"k": 0}

    def compiled(args):
        failure["k"] += 1
        k = failure["k"] % 4
        if k == 0:
            raise ValueError("graph failed")
        if k == 1:
            return [args[0] * args[1]]  # too few outputs
        if k == 2:
            return [torch.ones(5, device=device), args[0] * args[1]]  # bad update
        return [(args[0] + 1).detach(), args[0] * args[1]]

    compiled._boxed_call = True
    up, ours = D.build_pair(compiled, kwargs)
    a, b = torch.randn(3, device=device), torch.randn(3, device=device)
    for w in (up, ours):
        outcomes = []
        for _ in range(8):  # warm up
            try:
                w([a, b])
            except Exception:  # noqa: BLE001
                pass
        before = (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(w))
        for _ in range(1000):
            try:
                w([a, b])
                outcomes.append(None)
            except Exception as e:  # noqa: BLE001
                outcomes.append(type(e).__name__)
        assert (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(w)) == before
        assert set(outcomes) == {None, "ValueError", "AssertionError", "RuntimeError"}, set(outcomes)
