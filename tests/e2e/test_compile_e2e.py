"""End to end through ``torch.compile``: ``backend="aot_eager"`` for the
precise programs in inference, ``no_grad``, ``inference_mode`` and training;
modules with parameters and buffers; a few ``backend="inductor"`` cases; and
AOTAutogradCache hits, which must build C wrappers too.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

import _differential as D
from _cache import BUNDLED_CACHE, cache_backend
from _cases import *  # noqa: F403  (the f_* programs, MODES, ctx_for, inputs_for)

# Marked canary: on a torch where the import is inactive these run too
# (upstream vs upstream with the package imported), the canary's end-to-end
# proof that nothing changes. The AOTAutogradCache tests are not: they need a
# torch whose aot_eager backend can be forced to cache.

# (fn, shapes, inputs mutated in place: non-leaf in training)
E2E_CASES = {
    "plain": (f_plain, [(3, 4), (3, 4)], ()),
    "data_mutation": (f_data, [(3, 4)], (0,)),
    "data_mutation_returned": (f_data_returned, [(3, 4)], (0,)),
    "view": (f_view, [(3, 4)], ()),
    "select": (f_select, [(3, 4)], ()),
    "unsqueeze": (f_unsqueeze, [(3, 4)], ()),
    "input_and_compute": (f_identity_and_compute, [(3, 4)], ()),
    "many_views": (f_many_views, [(3, 4), (3, 4)], ()),
    "detached_view_of_input": (f_detached_view_of_input, [(3, 4), (3, 4)], ()),
    "intermediate_view": (f_interm_view, [(3, 4)], ()),
    "intermediate_base_is_output": (f_interm_base_is_output, [(3, 4)], ()),
    "intermediate_many": (f_interm_many, [(3, 4)], ()),
    "intermediate_chain": (f_interm_chain, [(3, 4)], ()),
    "intermediate_detached": (f_interm_detached, [(3, 4)], ()),
    "intermediate_two_bases": (f_interm_two_bases, [(3, 4), (3, 4)], ()),
    "non_tensor_outputs": (f_nontensor, [(3, 4), (3, 4)], ()),
}


@pytest.mark.canary
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(E2E_CASES))
def test_aot_eager(device, mode, case):
    fn, shapes, mutated = E2E_CASES[case]
    D.run_differential(
        fn,
        inputs_for(shapes, mode, mutated),
        ctx=ctx_for(mode),
        compile="aot_eager",
        device=device,
        calls=3,
    )


@pytest.mark.canary
@pytest.mark.parametrize("fn", [f_leaf_detach_mut, f_leaf_no_grad_mut], ids=["detach", "no_grad"])
def test_aot_eager_hidden_leaf_mutation(device, fn):
    """A leaf that requires grad, mutated where autograd does not see it."""
    on = D.run_differential(
        fn,
        lambda d: (torch.randn(3, 4, device=d, requires_grad=True),),
        compile="aot_eager",
        device=device,
    )
    assert on.calls[0]["inputs"][0]["version_delta"] > 0


@pytest.mark.canary
def test_aot_eager_detach_input(device):
    def factory(d):
        base = torch.randn(3, device=d, requires_grad=True)
        return D.Inputs((torch.randn(3, device=d, requires_grad=True), base.clone()), (base,))

    on = D.run_differential(f_detach_input, factory, compile="aot_eager", device=device)
    assert on.meta["detach"] == [1], on.meta


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        y = torch.relu(self.bn(self.lin(x)))
        return y, y.view(-1), x.t()


@pytest.mark.canary
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("train_mode", [True, False], ids=["module_train", "module_eval"])
def test_aot_eager_module(device, mode, train_mode):
    """Parameters, and BatchNorm buffers mutated in place (in training mode)."""

    def factory():
        return Net().train(train_mode)

    D.run_differential(
        factory,
        inputs_for([(5, 6)], "plain"),
        module=True,
        ctx=ctx_for(mode),
        compile="aot_eager",
        device=device,
        calls=3,
    )


# ---------------------------------------------------------------------------
# inductor (slow here: a few cases only)


def f_inductor(a, b):
    a.add_(1)
    y = (a * b).sin()
    return y, y.t(), b.view(-1), a.sum()


@pytest.mark.canary
@pytest.mark.inductor
@pytest.mark.parametrize("mode", ["plain", "train"])
def test_inductor(device, mode):
    """Inductor keeps the data mutation in the graph in inference (a version
    bump in the wrapper), and outputs alias inputs and intermediates. The "on"
    run loads the graph from the AOTAutogradCache that the "off" run filled,
    so the C wrapper is built on a cache hit here."""
    before = _cache_counts()
    on = D.run_differential(
        f_inductor,
        inputs_for([(8, 8), (8, 8)], mode, mutated=(0,)),
        compile="inductor",
        device=device,
        calls=2,
    )
    hits = _cache_counts().get("autograd_cache_hit", 0) - before.get("autograd_cache_hit", 0)
    assert hits >= 1, (before, _cache_counts())
    if mode == "plain":
        assert on.meta["bump"] == [0], on.meta


@pytest.mark.canary
@pytest.mark.inductor
def test_inductor_inference_mode(device):
    D.run_differential(
        f_interm_base_is_output,
        inputs_for([(8, 8)], "inference_mode"),
        ctx=torch.inference_mode,
        compile="inductor",
        device=device,
    )


# ---------------------------------------------------------------------------
# AOTAutogradCache

def _cache_counts():
    return dict(counters["aot_autograd"])


def _cached_run(fn, inputs, use_c, device, **kw):
    before = _cache_counts()
    run = D.run_once(fn, inputs, use_c=use_c, device=device, **kw)
    after = _cache_counts()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return run, {k: v for k, v in delta.items() if v}


@pytest.mark.parametrize("mode", ["plain", "train"])
def test_autograd_cache_hit_builds_c_wrapper(device, mode):
    """A cache hit runs RuntimeWrapper.post_compile again: with the C runtime
    on it must build a C wrapper; off, upstream's. All three runs agree."""
    AOTAutogradCache.clear()
    fn, shapes, mutated = f_interm_base_is_output, [(3, 4)], ()
    inputs = inputs_for(shapes, mode, mutated)
    kw = dict(compile=cache_backend(), functorch_config=BUNDLED_CACHE, calls=2)

    miss, d_miss = _cached_run(fn, inputs, False, device, **kw)
    assert d_miss.get("autograd_cache_miss") == 1 and d_miss.get("autograd_cache_saved"), d_miss
    D.check_runtime_used(miss)

    hit_on, d_on = _cached_run(fn, inputs, True, device, **kw)
    assert d_on.get("autograd_cache_hit") == 1, d_on
    D.check_runtime_used(hit_on)

    hit_off, d_off = _cached_run(fn, inputs, False, device, **kw)
    assert d_off.get("autograd_cache_hit") == 1, d_off
    D.check_runtime_used(hit_off)

    D.compare_runs(miss, hit_on)
    D.compare_runs(hit_off, hit_on)


@pytest.mark.needs_c
def test_autograd_cache_hit_respects_disable(device):
    """``enabled(False)`` applies to cache hits too."""
    AOTAutogradCache.clear()
    inputs = inputs_for([(3, 4)], "plain")
    kw = dict(compile=cache_backend(), functorch_config=BUNDLED_CACHE, calls=1)
    _cached_run(f_view, inputs, True, device, **kw)
    run, delta = _cached_run(f_view, inputs, False, device, **kw)
    assert delta.get("autograd_cache_hit") == 1, delta
    assert run.built() == 0 and not D.is_c_wrapper(run.wrappers[0]["result"])


@pytest.mark.inductor
def test_inductor_autograd_cache_hit(device):
    """Inductor's own AOTAutogradCache (on by default): a hit with C on."""
    AOTAutogradCache.clear()
    inputs = inputs_for([(8, 8), (8, 8)], "train", mutated=(0,))
    miss, d_miss = _cached_run(f_inductor, inputs, False, device, compile="inductor")
    assert d_miss.get("autograd_cache_saved"), d_miss
    hit, d_hit = _cached_run(f_inductor, inputs, True, device, compile="inductor")
    assert d_hit.get("autograd_cache_hit") == 1, d_hit
    D.check_runtime_used(hit)
    D.compare_runs(miss, hit)
