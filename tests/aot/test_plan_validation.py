"""``torch_aot_rt._C.RuntimeWrapper(compiled_fn, **plan)`` validates its plan
once, when it is built: a malformed plan is a ValueError (a missing or unknown
keyword a TypeError), never a crash or a wrapper that misbehaves later.

The plans are real ones (``_plan.make_plan`` on builder arguments captured
from a compile) with one field broken at a time.
"""

from __future__ import annotations

import pytest
import torch

import _differential as D

pytestmark = pytest.mark.needs_c


def f_mut_alias(a, b):
    a.add_(1)
    b.t_()
    y = a * 2
    return a.view(-1), y, y.t(), b, a


def _real_plan(training=False):
    from torch_aot_rt import _plan

    def make():
        a = torch.randn(3, 4, requires_grad=training)
        b = torch.randn(4, 4, requires_grad=training)
        return [a.clone(), b.clone()] if training else [a, b]

    compiled_fn, kwargs = D.capture_wrapper_kwargs(f_mut_alias, make())
    if not getattr(compiled_fn, "_boxed_call", False):
        compiled_fn = D.boxed(compiled_fn)
    plan = _plan.make_plan(compiled_fn, **kwargs)
    return compiled_fn, plan, make


@pytest.fixture(params=[False, True], ids=["inference", "training"])
def real_plan(request):
    return _real_plan(request.param)


def _replace_record(seq, index, position, value):
    seq = list(seq)
    rec = list(seq[index])
    rec[position] = value
    seq[index] = tuple(rec)
    return tuple(seq)


def test_real_plan_builds_and_runs(real_plan):
    """The control: the unbroken plan builds a wrapper that matches upstream."""
    compiled_fn, plan, make = real_plan
    w = D._C.RuntimeWrapper(compiled_fn, **plan)
    assert plan["num_mutated"] == 2 and plan["outputs"] is not None
    outs = w(make())
    assert len(outs) == 5


# Each: plan -> broken plan. The plan has 2 captured inputs (a and b, both
# mutated), 2 mutations, and 5 user outputs (one is_input, one alias of input,
# two aliases of an intermediate, one plain), plus the intermediate base.
BROKEN = {
    "trace_joint_not_bool": lambda p: {**p, "trace_joint": 1},
    "disable_amp_not_bool": lambda p: {**p, "disable_amp": None},
    "alias_offset_not_bool": lambda p: {**p, "alias_translates_storage_offset": "yes"},
    "hooks_flag_not_bool": lambda p: {**p, "disable_saved_tensors_hooks": 0},
    "capture_not_sequence": lambda p: {**p, "capture": 5},
    "capture_negative": lambda p: {**p, "capture": (0, -1)},
    "capture_not_int": lambda p: {**p, "capture": (0, "1")},
    "capture_bool": lambda p: {**p, "capture": (0, True)},
    "capture_huge": lambda p: {**p, "capture": (0, 2**80)},
    "bump_negative": lambda p: {**p, "bump": (-3,)},
    "detach_without_trace_joint": lambda p: {**p, "trace_joint": False, "detach": (0,)},
    "detach_negative": lambda p: {**p, "trace_joint": True, "detach": (-1,)},
    "num_mutated_negative": lambda p: {**p, "num_mutated": -1},
    "expected_outs_below_num_mutated": lambda p: {**p, "expected_outs": 1},
    "mutations_count": lambda p: {**p, "mutations": p["mutations"][:1]},
    "mutations_not_sequence": lambda p: {**p, "mutations": 3},
    "mutation_not_tuple": lambda p: {**p, "mutations": (list(p["mutations"][0]),) + p["mutations"][1:]},
    "mutation_short_tuple": lambda p: {**p, "mutations": (p["mutations"][0][:2],) + p["mutations"][1:]},
    "mutation_slot_out_of_range": lambda p: {**p, "mutations": _replace_record(p["mutations"], 0, 0, 2)},
    "mutation_slot_negative": lambda p: {**p, "mutations": _replace_record(p["mutations"], 0, 0, -1)},
    "mutation_kind_unknown": lambda p: {**p, "mutations": _replace_record(p["mutations"], 0, 1, 9)},
    "mutation_flags_out_of_range": lambda p: {**p, "mutations": _replace_record(p["mutations"], 0, 2, 64)},
    "mutation_flags_on_metadata_kind": lambda p: {
        **p,
        "mutations": _replace_record(_replace_record(p["mutations"], 1, 1, 2), 1, 2, 1),
    },
    "mutation_leaf_stream_error_not_leaf": lambda p: {
        **p,
        "mutations": _replace_record(_replace_record(p["mutations"], 0, 1, 3), 0, 2, 8),
    },
    "dynamic_dims_attr_not_str": lambda p: {**p, "dynamic_dims_attr": None},
    "view_replay_forced_not_bool": lambda p: {**p, "view_replay_forced": 1},
    "args_list_check_not_bool": lambda p: {**p, "args_list_check": None},
    "mutation_leaf_and_stream": lambda p: {
        **p,
        "mutations": _replace_record(_replace_record(p["mutations"], 0, 1, 3), 0, 2, 2 | 4),
    },
    "outputs_too_many": lambda p: {**p, "outputs": p["outputs"] + p["outputs"]},
    "outputs_not_sequence": lambda p: {**p, "outputs": 1.5},
    "output_not_tuple": lambda p: {**p, "outputs": (list(p["outputs"][0]),) + p["outputs"][1:]},
    "output_kind_unknown": lambda p: {**p, "outputs": _replace_record(p["outputs"], 0, 0, 17)},
    "output_is_input_slot_out_of_range": lambda p: {
        **p, "outputs": _replace_record(p["outputs"], 3, 1, 2)
    },
    "output_intermediate_index_out_of_range": lambda p: {
        **p, "outputs": _replace_record(p["outputs"], 2, 1, 99)
    },
    "output_index_negative": lambda p: {**p, "outputs": _replace_record(p["outputs"], 0, 1, -2)},
    "output_unwrap_not_bool": lambda p: {**p, "outputs": _replace_record(p["outputs"], 2, 2, 1)},
    "output_requires_grad_not_bool": lambda p: {
        **p, "outputs": _replace_record(p["outputs"], 2, 3, None)
    },
    "dynamic_dims_index_out_of_range": lambda p: {**p, "dynamic_dims": ((5, {0}),)},
    "dynamic_dims_not_set": lambda p: {**p, "dynamic_dims": ((0, [0]),)},
    "dynamic_dims_short_record": lambda p: {**p, "dynamic_dims": ((0,),)},
    "grad_enabled_mutation_not_bool": lambda p: {**p, "grad_enabled_mutation": 1},
    "first_invocation_not_callable": lambda p: {**p, "first_invocation": 3},
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_malformed_plan_is_value_error(real_plan, case):
    compiled_fn, plan, _ = real_plan
    broken = BROKEN[case](plan)
    assert repr(broken) != repr(plan)
    with pytest.raises(ValueError):
        D._C.RuntimeWrapper(compiled_fn, **broken)


def test_compiled_fn_not_callable(real_plan):
    _, plan, _ = real_plan
    with pytest.raises(ValueError):
        D._C.RuntimeWrapper(42, **plan)


@pytest.mark.parametrize("key", ["capture", "mutations", "outputs", "first_invocation", "trace_joint",
                                 "dynamic_dims_attr", "view_replay_forced"])
def test_missing_key_is_type_error(real_plan, key):
    compiled_fn, plan, _ = real_plan
    plan = dict(plan)
    del plan[key]
    with pytest.raises(TypeError):
        D._C.RuntimeWrapper(compiled_fn, **plan)


def test_unknown_key_is_type_error(real_plan):
    compiled_fn, plan, _ = real_plan
    with pytest.raises(TypeError):
        D._C.RuntimeWrapper(compiled_fn, **plan, not_a_key=1)


def test_positional_arguments(real_plan):
    compiled_fn, plan, _ = real_plan
    with pytest.raises(TypeError):
        D._C.RuntimeWrapper(**plan)
    with pytest.raises(TypeError):
        D._C.RuntimeWrapper(compiled_fn, compiled_fn, **plan)
    with pytest.raises(TypeError):
        D._C.RuntimeWrapper(compiled_fn)


def test_many_malformed_plans_leak_nothing(real_plan):
    """Failed constructions release what they took (refcounts stable)."""
    import sys

    compiled_fn, plan, _ = real_plan
    broken = [f(plan) for f in BROKEN.values()]
    for b in broken:  # warm up
        with pytest.raises(ValueError):
            D._C.RuntimeWrapper(compiled_fn, **b)
    def counts():
        return {
            k: sys.getrefcount(plan[k])
            for k in sorted(plan)
            # not the shared () singleton: anything anywhere changes its count
            if not isinstance(plan[k], (bool, int, type(None))) and plan[k] != ()
        } | {"compiled_fn": sys.getrefcount(compiled_fn)}

    before = counts()
    for _ in range(50):
        for b in broken:
            with pytest.raises(ValueError):
                D._C.RuntimeWrapper(compiled_fn, **b)
    assert counts() == before


# ---------------------------------------------------------------------------
# The release-dependent fields of the CompiledFunction plans


@pytest.fixture(scope="module")
def autograd_plans():
    """The forward and backward plans of a real training compile."""
    from functorch.compile import aot_function, nop

    from torch_aot_rt import _autograd_plan

    seen = {}
    fwd, bwd = _autograd_plan._forward_plan, _autograd_plan._backward_plan

    def record(name, fn):
        def wrapper(*args):
            seen[name] = (args[0], fn(*args))
            return seen[name][1]

        return wrapper

    torch._dynamo.reset()
    _autograd_plan._forward_plan = record("forward", fwd)
    _autograd_plan._backward_plan = record("backward", bwd)
    try:
        g = aot_function(lambda a, b: (a * b,), fw_compiler=nop, bw_compiler=nop)
        g(torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))
    finally:
        _autograd_plan._forward_plan, _autograd_plan._backward_plan = fwd, bwd
    cls = seen["forward"][0]
    return cls, seen["forward"][1], seen["backward"][1]


def _bound_registry():
    from torch_aot_rt import _state

    return _state.release().snapshots_external_objects


FORWARD_BROKEN = {
    "saved_is_graph_input": [5, (1, 0), (True, None), "ab"],
    "snapshot_external_objects": [1, None, "yes"],
}
BACKWARD_BROKEN = {
    "restore_external_objects": [1, None],
    "copy_context": [0, "no"],
}


@pytest.mark.parametrize(
    "key,value", [(k, v) for k, vs in FORWARD_BROKEN.items() for v in vs], ids=repr
)
def test_forward_plan_release_fields_validated(autograd_plans, key, value):
    cls, plan, _ = autograd_plans
    upstream = cls.__dict__["forward"].__func__
    D._C.CompiledForward(upstream=upstream, **plan)  # the real plan is accepted
    with pytest.raises(ValueError, match=f"plan: {key} must be"):
        D._C.CompiledForward(upstream=upstream, **{**plan, key: value})


@pytest.mark.parametrize(
    "key,value", [(k, v) for k, vs in BACKWARD_BROKEN.items() for v in vs], ids=repr
)
def test_backward_plan_release_fields_validated(autograd_plans, key, value):
    cls, _, plan = autograd_plans
    upstream = cls.__dict__["backward"].__func__
    D._C.CompiledBackward(upstream=upstream, **plan)
    with pytest.raises(ValueError, match=f"plan: {key} must be"):
        D._C.CompiledBackward(upstream=upstream, **{**plan, key: value})


@pytest.mark.parametrize("key", ["saved_is_graph_input", "snapshot_external_objects"])
def test_forward_plan_release_fields_required(autograd_plans, key):
    cls, plan, _ = autograd_plans
    plan = dict(plan)
    del plan[key]
    with pytest.raises(TypeError, match=f"missing required keyword argument '{key}'"):
        D._C.CompiledForward(upstream=cls.__dict__["forward"].__func__, **plan)


def test_external_objects_need_the_registry(autograd_plans):
    """A plan asking for the snapshot is refused where the release bound no
    registry (2.13), and accepted where it did (2.14)."""
    cls, fplan, bplan = autograd_plans
    fwd = lambda: D._C.CompiledForward(  # noqa: E731
        upstream=cls.__dict__["forward"].__func__, **{**fplan, "snapshot_external_objects": True}
    )
    bwd = lambda: D._C.CompiledBackward(  # noqa: E731
        upstream=cls.__dict__["backward"].__func__, **{**bplan, "restore_external_objects": True}
    )
    if _bound_registry():
        fwd(), bwd()
    else:
        with pytest.raises(ValueError, match="without the registry"):
            fwd()
        with pytest.raises(ValueError, match="without the registry"):
            bwd()
