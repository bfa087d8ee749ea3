"""2.11 against 2.12: what 2.11's CompiledFunction (built inline by the old
positional ``AOTDispatchAutograd.post_compile``) and its runtime wrapper do
differently, C path off vs on.

Each difference is a ``Release`` field (``torch_aot_rt._versions``). The tests
read the installed release's entry (the gate's; on 2.11 that is 2.11's
verified entry) and assert what that release does,
so on 2.11 each fails if 2.12's (or 2.13's) behaviour ran; where a plan bit
can be exercised on any release, the C object built with the 2.11 entry's
bits is checked against 2.11's source, written out.
"""

from __future__ import annotations

import types

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import leaf
from torch_aot_rt import _autograd_plan, _plan, _versions

GATE = _versions.resolve(torch.__version__)
RELEASE = GATE.release
REL_211 = next(r for r in _versions.VERIFIED if r.series == (2, 11))
REL_212 = next(r for r in _versions.VERIFIED if r.series == (2, 12))
REL_213 = next(r for r in _versions.VERIFIED if r.series == (2, 13))
pytestmark = pytest.mark.skipif(
    RELEASE is None, reason=f"torch {torch.__version__} has no release entry the C path runs"
)


def test_211_entry_differs_from_212_where_its_source_does():
    """The fields 2.11's source sets apart from 2.12's (the rest is shared).

    `pythons` is left out: which CPythons a release was verified on is a
    gate fact, not something its source sets."""
    differ = {
        name for name in REL_211.__dataclass_fields__
        if name != "pythons" and getattr(REL_211, name) != getattr(REL_212, name)
    }
    assert differ == {
        "series", "opaque_base", "prologue_range_exited_on_error", "closure_compiler_wrappers",
        "compile_wrapper_fullgraph", "compile_wrapper_strips_user_error", "config_patcher",
        "compiled_function_factory", "original_view_tracking_sets_on_enter",
        "backward_runs_in_tls_context", "surviving_grad_attr", "tangent_error_context",
        "downgrade_keeps_grad_enabled_mutation", "config_read",
    }, differ
    # alike on both, unlike 2.13's generated wrapper
    assert REL_211.bump_from_generator and REL_212.bump_from_generator
    assert REL_211.opaque_base is None
    assert REL_211.surviving_grad_attr == "requires_grad"


# ---------------------------------------------------------------------------
# view replay around the training call: _force_original_view_tracking(True)


from test_release_212 import _ViewReplayCalls  # noqa: E402


def _view_replay_calls(release, prev):
    """What a TorchFunctionMode sees of view replay around the training call."""
    if not release.forces_original_view_tracking:
        return [] if prev else [True, False]  # 2.13's generated read/set/restore
    # __init__ sets; __enter__ sets again (2.12) or is `pass` (2.11); __exit__ restores
    return [True] * (2 if release.original_view_tracking_sets_on_enter else 1) + [prev]


def f_double(a):
    return (a * 2,)


@pytest.mark.parametrize("prev", [False, True])
def test_211_view_replay_plan_bit(prev):
    """The runtime wrapper built with 2.11's bits: one set, one restore."""
    a = torch.randn(3, requires_grad=True)
    compiled_fn, kwargs = D.capture_wrapper_kwargs(f_double, [a])
    if not getattr(compiled_fn, "_boxed_call", False):
        compiled_fn = D.boxed(compiled_fn)
    for release in (REL_211, REL_212):
        plan = _plan.make_plan(compiled_fn, **kwargs, release=release)
        assert plan["view_replay_set_on_enter"] is (release is REL_212)
        w = D._C.RuntimeWrapper(compiled_fn, **plan)
        torch._C._set_view_replay_enabled(prev)
        try:
            with _ViewReplayCalls() as seen:
                (out,) = w([a])
            assert torch._C._is_view_replay_enabled() is prev
        finally:
            torch._C._set_view_replay_enabled(False)
        assert seen.calls == _view_replay_calls(release, prev), (release.name, seen.calls)
        assert torch.equal(out, a * 2)


@pytest.mark.parametrize("prev", [False, True])
def test_view_replay_calls_of_the_training_call(prev):
    """End to end, upstream's runtime wrapper and ours see the calls of the
    installed release (2.11: two, 2.12: three)."""
    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        a = leaf(3)
        with T.c_runtime(use_c):
            g = aot_function(f_double, fw_compiler=nop, bw_compiler=nop)
            g(a)
        torch._C._set_view_replay_enabled(prev)
        try:
            with _ViewReplayCalls() as mode:
                (out,) = g(a)
            assert torch._C._is_view_replay_enabled() is prev
        finally:
            torch._C._set_view_replay_enabled(False)
        seen[use_c] = mode.calls
        assert torch.equal(out, a * 2)
    assert seen[False] == seen[True] == _view_replay_calls(RELEASE, prev), seen


# ---------------------------------------------------------------------------
# the lazy backward compile: 2.11's _backward_impl reads CompiledFunction.compiled_bw


class _CountingCompiler:
    def __init__(self):
        self.compiles = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1

        def run(args):
            self.calls += 1
            return gm(*args)

        run._boxed_call = True
        return run


def f_mul(a, b):
    return (a * b).sin(), a + 1


@pytest.mark.parametrize("change", ["replaced", "cleared"])
def test_compiled_bw_is_the_class_attribute(change):
    """After the first backward, CompiledFunction.compiled_bw is replaced (or
    set back to None). 2.11's _backward_impl reads the class attribute on
    every call: the next backward runs the replacement (recompiles lazily);
    2.12's reads its _AutogradBackwardCompiler's, which the class attribute
    does not change."""
    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        counting = _CountingCompiler()
        with T.c_runtime(use_c):
            g = aot_function(f_mul, fw_compiler=nop, bw_compiler=counting)
            a, b = leaf(3, 4), leaf(3, 4)
            outs = g(a, b)
        (cls,) = T.check_classes(outs, use_c, expect=1)
        outs[0].sum().backward()
        assert (counting.compiles, counting.calls) == (1, 1)
        replacement_calls = []
        if change == "replaced":
            first = cls.compiled_bw

            def replacement(args):
                replacement_calls.append(len(args))
                return first(args)

            replacement._boxed_call = True
            cls.compiled_bw = replacement
        else:
            cls.compiled_bw = None
        outs = g(a, b)
        outs[0].sum().backward()
        results[use_c] = (counting.compiles, counting.calls, replacement_calls,
                          cls.compiled_bw is None, a.grad.clone(), b.grad.clone())
    off, on = results[False], results[True]
    assert off[:4] == on[:4], (off[:4], on[:4])
    assert torch.equal(off[4], on[4]) and torch.equal(off[5], on[5])
    per_call = not RELEASE.compiled_function_factory
    if change == "replaced":
        # 2.11: the replacement ran, the compiled backward through it
        assert off[:3] == ((1, 2, [off[2][0]]) if per_call else (1, 2, [])), off[:3]
    else:
        # 2.11: compiled again (and the class attribute set to it)
        # 2.12 on: the backward sets the class attribute back to its compiler's
        assert off[:4] == ((2, 2, [], False) if per_call else (1, 2, [], False)), off[:4]


def test_211_backward_plan_reads_the_class_attribute():
    """The backward plan of 2.11's class: no compiler object, upstream's
    _backward_impl for the lazy compile; 2.12 on the reverse."""
    torch._dynamo.reset()
    with T.c_runtime(True):
        outs = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)(leaf(3, 4), leaf(3, 4))
    (cls,) = T.check_classes(outs, True, expect=1)
    closure = _autograd_plan._closure(cls.backward.__wrapped__)
    assert ("backward_compiler" in closure) is False or RELEASE.compiled_function_factory
    if not RELEASE.compiled_function_factory:
        assert cls.__qualname__ == _autograd_plan._INLINE_QUALNAME
        assert not hasattr(__import__(
            "torch._functorch._aot_autograd.runtime_wrappers", fromlist=["x"]),
            "_AOTDispatchAutogradFunctionFactory")


# ---------------------------------------------------------------------------
# process_runtime_tangent's arguments: (x, meta) on 2.11


class _MyTensor(torch.Tensor):
    pass


def test_tangent_of_another_type_goes_to_upstream():
    """A tangent that is not an exact torch.Tensor goes to upstream's
    process_runtime_tangent: with the release's arguments (2.11: x and meta
    only; its signature has no more, so 2.12's call would raise TypeError)."""
    import inspect

    import torch._functorch._aot_autograd.runtime_wrappers as rw

    params = inspect.signature(rw.AOTDispatchAutograd.process_runtime_tangent).parameters
    assert ("tangent_idx" in params) is RELEASE.tangent_error_context
    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)
            a, b = leaf(3, 4), leaf(3, 4)
            outs = g(a, b)
        grad = torch.ones(3, 4).as_subclass(_MyTensor)
        with pytest.raises(RuntimeError) as info:
            outs[0].backward(grad)
        results[use_c] = str(info.value)
    # upstream's error, built by upstream's function (2.12 on: it names the tangent)
    assert results[False] == results[True], results
    assert "metadata incorrectly" in results[False]


# ---------------------------------------------------------------------------
# which grads reach the compiled backward: requires_grad (2.11)


def _meta_with_output(requires_grad, requires_grad_for_backward):
    from torch._functorch._aot_autograd.schemas import OutputType

    out = types.SimpleNamespace(
        output_type=OutputType.non_alias, raw_type=torch.Tensor,
        requires_grad=requires_grad, requires_grad_for_backward=requires_grad_for_backward,
    )
    return types.SimpleNamespace(
        num_outputs=1, num_mutated_inp_runtime_indices=0, num_intermediate_bases=0,
        mutated_inp_runtime_indices=[], input_info=[], output_info=[out],
        subclass_tangent_meta=[None], traced_tangents_descs=[None],
        tangent_source_stack_traces=None, compile_id_str="0/0", deterministic=None,
        indices_of_inputs_that_requires_grad_with_mutations_in_bw=[],
        num_tensors_saved_with_no_vc_check=0, num_backward_tokens=0,
    )


@pytest.mark.parametrize("release", [REL_211, REL_212], ids=lambda r: r.name)
def test_surviving_grads_by_the_release_attribute(release):
    """An output that requires grad but not for backward (a view made under
    no_grad, 2.12's metadata): 2.12 drops its grad, 2.11 (which has only
    requires_grad) passes it to the compiled backward."""
    meta = _meta_with_output(True, False)
    spec = types.SimpleNamespace(
        fw_metadata=meta, maybe_subclass_meta=None, disable_amp=False, backward_state_indices=[],
    )
    plan = _autograd_plan._backward_plan(None, spec, None, None, None, release)
    assert plan["surviving"] == ((0,) if release is REL_211 else ())
    assert plan["tls_context"] is (release is REL_212)
    assert plan["tangent_context_args"] is (release is REL_212)
    assert plan["compile_id"] == (None if release is REL_211 else "0/0")


# ---------------------------------------------------------------------------
# how 2.11's class is found: CompiledFunction.apply handed to the runtime wrapper


def test_inline_class_is_recognised_by_its_apply():
    def make(qualname, apply=None):
        ns = {"forward": staticmethod(lambda ctx, x: x),
              "backward": staticmethod(lambda ctx, g: g)}
        if apply is not None:
            ns["apply"] = apply
        cls = type("CompiledFunction", (torch.autograd.Function,), ns)
        cls.__qualname__ = qualname
        return cls

    inline = make(_autograd_plan._INLINE_QUALNAME)
    assert _autograd_plan._inline_class(inline.apply) is inline
    other = make("_AOTDispatchAutogradFunctionFactory.build.<locals>.CompiledFunction")
    assert _autograd_plan._inline_class(other.apply) is None
    overridden = make(_autograd_plan._INLINE_QUALNAME, classmethod(lambda cls, *a: None))
    assert _autograd_plan._inline_class(overridden.apply) is None
    assert _autograd_plan._inline_class(f_double) is None
    assert _autograd_plan.adopt_inline_class(f_double) is f_double


@pytest.mark.skipif(
    RELEASE is None or RELEASE.compiled_function_factory,
    reason="the factory's class keeps graph-safe RNG states in its _AutogradRngStateTracker, "
    "which the C plans call (not the inline closure of 2.11)",
)
def test_211_graphsafe_rng_states_keep_upstreams_class():
    """2.11's RNG bookkeeping is the closure of its forward/backward: a graph
    with graph-safe RNG states (CUDA) keeps upstream's class, counted."""
    from torch_aot_rt._plan import Unsupported

    torch._dynamo.reset()
    with T.c_runtime(False):
        outs = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)(leaf(3, 4), leaf(3, 4))
    cls = outs[0].grad_fn._forward_cls
    spec = _autograd_plan._inline_spec(cls)
    meta = cls.metadata
    meta.num_graphsafe_rng_states = 1
    try:
        with pytest.raises(Unsupported, match="graph-safe RNG states on torch 2.11"):
            _autograd_plan.install_c_function(cls, spec, RELEASE)
    finally:
        meta.num_graphsafe_rng_states = 0
    assert "forward" in cls.__dict__ and type(cls.__dict__["forward"].__func__).__name__ == "function"


def test_only_the_class_post_compile_builds_is_adopted():
    """A CompiledFunction.apply handed to the runtime-wrapper builder outside
    the post_compile that built its class (here one built with the C path
    off) keeps upstream's class: the C runtime wrapper calls its apply."""
    a = torch.randn(3, requires_grad=True)
    compiled_fn, kwargs = D.capture_wrapper_kwargs(f_double, [a])
    if RELEASE.compiled_function_factory:  # the factory's class: the C apply is passed
        assert type(compiled_fn).__name__ != "function"
        return
    cls = _autograd_plan._inline_class(compiled_fn)
    assert cls is not None
    up, ours = D.build_pair(compiled_fn, kwargs)
    assert type(cls.__dict__["forward"].__func__).__name__ == "function"  # upstream's
    (out_up,), (out_ours,) = up([a]), ours([a])
    assert torch.equal(out_up, out_ours)
    assert type(out_ours.grad_fn).__name__ == "CompiledFunctionBackward"


def f_mut_two(x, y):
    x.add_(1)
    y.add_(1)
    return (x + y,)


@pytest.mark.parametrize("release", [REL_211, REL_213], ids=lambda r: r.name)
def test_version_bump_reads_args_lazily(release):
    """keep_input_mutations' bump of graph-handled mutations: 2.11/2.12 bump
    through a generator (each tensor as it is read: a read that fails leaves
    the earlier ones bumped); 2.13 reads them all first."""
    x, y = torch.randn(3), torch.randn(3)
    compiled_fn, kwargs = D.capture_wrapper_kwargs(
        f_mut_two, [x.clone(), y.clone()], keep_inference_input_mutations=True
    )
    plan = _plan.make_plan(compiled_fn, **kwargs, release=release)
    assert plan["bump"] == (0, 1) and plan["bump_from_generator"] is (release is REL_211)
    w = D._C.RuntimeWrapper(compiled_fn, **plan)
    before = x._version
    with pytest.raises(IndexError):
        w([x])
    assert x._version == before + (1 if release is REL_211 else 0)
    if release is RELEASE and not RELEASE.bump_from_generator:
        # upstream's own, on this torch; not on 2.11/2.12, whose binding returns
        # with the read's exception pending, which poisons this interpreter's
        # later look-ups (tests/aot/test_direct.py _read_error_itself)
        up = D.upstream_builder()(compiled_fn, **kwargs)
        before = x._version
        with pytest.raises(IndexError):
            up([x])
        assert x._version == before
