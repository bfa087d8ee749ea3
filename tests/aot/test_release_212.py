"""2.12 and 2.11 (both verified): the runtime wrapper's plan bits, run on the
installed torch, C path off vs on (see test_release_semantics.py).
"""

from __future__ import annotations

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import leaf
from torch_aot_rt import _versions

from _release import RELEASE, _seeded

pytestmark = pytest.mark.skipif(
    RELEASE is None, reason=f"torch {torch.__version__} is not a verified release"
)


# ---------------------------------------------------------------------------
# 2.12 and 2.11 (both verified): the runtime wrapper's
# plan bits, run here on the installed torch. Each test builds the C wrapper
# with 2.12's plan and with the installed release's, and checks that each
# does what its release's upstream code does: a 2.12 test fails if the 2.13
# behaviour ran.

from torch.overrides import TorchFunctionMode  # noqa: E402

from torch_aot_rt import _C, _kinds, _plan  # noqa: E402

REL_212 = next(r for r in _versions.VERIFIED if r.series == (2, 12))
REL_211 = next(r for r in _versions.VERIFIED if r.series == (2, 11))
# the generated runtime wrapper's behaviour (2.13 on): what a 2.12 test must
# tell apart, whichever release is installed
REL_213 = next(r for r in _versions.VERIFIED if r.series == (2, 13))

# the entry whose CompiledFunction the installed torch builds the same way
REL_UNBOXED = REL_212 if RELEASE is None or RELEASE.compiled_function_factory else REL_211


def test_211_and_212_are_verified(monkeypatch):
    monkeypatch.delenv(_versions.UNVERIFIED_ENV, raising=False)
    py = (3, 11)  # a CPython both are verified on
    assert _versions.resolve("2.11.0", py).release is REL_211
    assert _versions.resolve("2.11.0+cu130", py).verified
    assert _versions.resolve("2.12.1+cu130", py).release is REL_212
    assert _versions.resolve("2.12.1", py).verified
    # the opt-in: a pre-release of 2.11 (or an older torch) gets 2.11's entry
    monkeypatch.setenv(_versions.UNVERIFIED_ENV, "1")
    assert _versions.resolve("2.11.0a0+git1234567", py).release is REL_211
    assert _versions.resolve("2.10.0", py).release is REL_211
    assert not _versions.resolve("2.10.0", py).verified


def _wrapper(fn, args, release, **plan_over):
    compiled_fn, kwargs = D.capture_wrapper_kwargs(fn, args)
    if not getattr(compiled_fn, "_boxed_call", False):
        compiled_fn = D.boxed(compiled_fn)
    plan = _plan.make_plan(compiled_fn, **kwargs, release=release)
    plan.update(plan_over)
    return _C.RuntimeWrapper(compiled_fn, **plan), plan


class _ViewReplayCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch._C._set_view_replay_enabled:
            self.calls.append(args[0])
        return func(*args, **(kwargs or {}))


def f_double(a):
    return (a * 2,)


@pytest.mark.parametrize("prev", [False, True])
def test_212_view_replay_forced_through_force_original_view_tracking(prev):
    """2.12: `with (_force_original_view_tracking(True), enable_grad()):`,
    which sets view replay in __init__ and __enter__ and restores it in
    __exit__ whatever it is; 2.13 sets it only when off and restores it
    only when changed. The oracle is torch's own context manager (2.11's
    __enter__ does not set it: there 2.12's calls are written out; see
    tests/aot/test_release_211.py)."""
    a = torch.randn(3, requires_grad=True)
    for release, forced in ((REL_212, True), (REL_213, REL_213.forces_original_view_tracking)):
        w, plan = _wrapper(f_double, [a], release)
        assert plan["view_replay_forced"] is forced
        torch._C._set_view_replay_enabled(prev)
        try:
            with _ViewReplayCalls() as seen:
                (out,) = w([a])
            assert torch._C._is_view_replay_enabled() is prev
            with _ViewReplayCalls() as oracle:
                if forced:
                    with torch.autograd._force_original_view_tracking(True), torch.enable_grad():
                        pass
        finally:
            torch._C._set_view_replay_enabled(False)
        want = oracle.calls if forced else ([] if prev else [True, False])
        if forced and not RELEASE.original_view_tracking_sets_on_enter:
            assert oracle.calls == [True, prev]  # 2.11's own
            want = [True, True, prev]
        assert seen.calls == want, (release.name, prev)
        assert torch.equal(out, a * 2)


def f_identity_dyn(x):
    return (x + 1,)


def test_212_dynamic_dims_go_on_the_attribute_its_dynamo_reads():
    x = torch.randn(3)
    for release, attr, other in (
        (REL_212, "_dynamo_weak_dynamic_indices", "_dynamo_propagated_dynamic_indices"),
        (REL_213, "_dynamo_propagated_dynamic_indices", "_dynamo_weak_dynamic_indices"),
        (RELEASE, RELEASE.dynamic_dims_attr,
         {"_dynamo_weak_dynamic_indices", "_dynamo_propagated_dynamic_indices"}
         .difference({RELEASE.dynamic_dims_attr}).pop()),
    ):
        w, plan = _wrapper(f_identity_dyn, [x], release, dynamic_dims=((0, {0}),))
        assert plan["dynamic_dims_attr"] == attr
        (out,) = w([x])
        assert getattr(out, attr) == {0}
        assert not hasattr(out, other)


def f_mut_leaf(x):
    x.mul_(2)
    return (x + 1,)


def test_212_leaf_mutation_goes_through_the_stream_check():
    """A mutated leaf input on a user stream: 2.12 raises for it unless it
    requires grad (`meta.is_leaf and original_inpt.requires_grad` first);
    2.13's generated epilogue never checks a leaf's stream."""
    import types

    meta = types.SimpleNamespace(
        mutated_inp_runtime_indices=[0],
        input_info=[types.SimpleNamespace(
            mutates_data=True, mutates_metadata=False, mutates_storage_metadata=False,
            is_leaf=True)],
        mutated_inp_stream_indices=[1],
    )
    leaf_12 = _plan._mutations(meta, {0: 0}, REL_212)[0][2]
    leaf_13 = _plan._mutations(meta, {0: 0}, REL_213)[0][2]
    assert leaf_12 == _kinds.MUT_LEAF | _kinds.MUT_LEAF_STREAM_ERROR
    assert leaf_13 == _kinds.MUT_LEAF
    x = torch.randn(3)
    for flags, raises in ((leaf_12, True), (leaf_13, False)):
        w, plan = _wrapper(f_mut_leaf, [x.clone()], REL_213)
        assert plan["mutations"][0][1] == _kinds.MUT_DATA
        plan["mutations"] = ((plan["mutations"][0][0], _kinds.MUT_DATA, flags),)
        w = _C.RuntimeWrapper(_compiled_of(f_mut_leaf, x), **plan)
        inp = torch.randn(3)
        before = inp.clone()
        if raises:
            with pytest.raises(RuntimeError, match="user-specified streams"):
                w([inp])
            assert torch.equal(inp, before)
        else:
            w([inp])
            assert torch.equal(inp, before * 2)
        # a leaf that requires grad: detach().copy_ on both releases
        g = torch.randn(3, requires_grad=True)
        gb = g.detach().clone()
        w([g])
        assert torch.equal(g.detach(), gb * 2) and g.grad_fn is None


def _compiled_of(fn, x):
    compiled_fn, _ = D.capture_wrapper_kwargs(fn, [x.clone()])
    if not getattr(compiled_fn, "_boxed_call", False):
        compiled_fn = D.boxed(compiled_fn)
    return compiled_fn


def test_212_inference_args_must_be_a_list():
    """2.12's invoker calls call_func_at_runtime_with_args, which raises for
    an args that is not a list (after grad mode is switched off, which is
    then restored); 2.13's generated call hands the tuple on."""
    x = torch.randn(3)
    w12, _ = _wrapper(f_identity_dyn, [x], REL_212)
    w13, _ = _wrapper(f_identity_dyn, [x], REL_213)
    assert torch.is_grad_enabled()
    with pytest.raises(AssertionError, match=r"^args must be a list, got <class 'tuple'>$"):
        w12((x,))
    assert torch.is_grad_enabled()
    (out,) = w13((x,))
    assert torch.equal(out, x + 1)
    (out,) = w12([x])
    assert torch.equal(out, x + 1)


def f_meta_mut(x):
    x.t_()
    return (x + 1,)


def test_212_metadata_mutation_alias_check_message():
    """Training, a metadata-only mutation whose updated value is not a
    TensorAlias: 2.12 checks inline ('expected TensorAlias for updated_inpt,
    got ...'), 2.13 calls _unwrap_tensoralias ('expected TensorAlias, got ...')."""
    x = torch.randn(2, 3)
    y = torch.randn(3, requires_grad=True)

    def f(x, y):
        x.t_()
        return (x + 1, y * 2)

    compiled_fn, kwargs = D.capture_wrapper_kwargs(f, [x.clone(), y])
    assert kwargs["trace_joint"]

    def bogus(args):
        return [torch.randn(3, 2), torch.randn(3, 2), torch.randn(3)]

    bogus._boxed_call = True
    for release, msg in ((REL_212, "expected TensorAlias for updated_inpt, got "),
                         (REL_213, "expected TensorAlias, got ")):
        plan = _plan.make_plan(bogus, **kwargs, release=release)
        assert plan["mutations"][0][1] == _kinds.MUT_METADATA
        w = _C.RuntimeWrapper(bogus, **plan)
        with pytest.raises(AssertionError) as e:
            w([x.clone(), y])
        assert str(e.value) == msg + "<class 'torch.Tensor'>"


def test_211_prologue_range_plan_bit():
    """2.11's runtime_wrapper exits the profiler range only right before the
    call (an error before it drops the entered range unexited); 2.12 on exit
    it in a finally. Only the plan bit is checked here: the range object is
    bound once, at install (tests of the range itself: test_features.py)."""
    x = torch.randn(3)
    for release, exits in ((REL_211, False), (REL_212, True), (REL_213, True)):
        _, plan = _wrapper(f_mut_leaf, [x.clone()], release)
        assert plan["prologue_range_exited_on_error"] is exits, release.name


def test_212_backward_takes_grads_unboxed(monkeypatch):
    """2.12's CompiledFunction.backward(ctx, *flat_args): the C backward
    built with 2.12's plan takes the grads as arguments (and gives what the
    boxed call gives with the installed release's plan, which refuses them
    unboxed with upstream's AssertionError; on 2.12 itself, what upstream's
    unboxed backward gives); its double-backward guard scans the args."""
    from torch_aot_rt import _state

    def f(a, b):
        return (a * b + 1, (a @ b.t()).sin())

    grads = (torch.ones(3, 4), torch.ones(3, 3))
    results = {}
    # None: upstream's own CompiledFunction (the installed torch's is unboxed:
    # 2.12, 2.11, whose class the 2.11 entry builds in place of 2.12's)
    for release in (REL_UNBOXED, None if not RELEASE.boxed_backward else RELEASE):
        if release is not None:
            monkeypatch.setattr(_state, "release", lambda release=release: release)
        _seeded()
        a, b = leaf(3, 4), leaf(3, 4)
        with T.c_runtime(release is not None):
            outs = aot_function(f, fw_compiler=nop, bw_compiler=nop)(a, b)
        monkeypatch.undo()
        gf = outs[0].grad_fn
        cls = gf._forward_cls
        assert (type(cls.__dict__["backward"].__func__).__name__ == "CompiledBackward") is \
            (release is not None)
        with torch.no_grad():
            if release is REL_UNBOXED or release is None:
                got = cls.backward(gf, *grads)
                with pytest.raises(AssertionError, match="expected 2 grad_outs, got 1"):
                    cls.backward(gf, list(grads))
            else:
                got = cls.backward(gf, list(grads))
                with pytest.raises(AssertionError, match="single mutable list"):
                    cls.backward(gf, *grads)
        results[getattr(release, "name", "upstream")] = [
            None if g is None else g.clone() for g in got]
    first, second = results.values()
    assert all(torch.equal(x, y) for x, y in zip(first, second))
