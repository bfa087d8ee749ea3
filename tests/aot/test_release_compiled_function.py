"""What changes between the verified torch releases in CompiledFunction, C
path off vs on: the contextvars context of the compiled backward, saved
opaque objects, compile_to_python's captured source, a forward returning one
output too many, the lazy backward compile under deferred_full_gc, and 2.15's
metadata and first-call changes (see test_release_semantics.py for what each
test pins).
"""

from __future__ import annotations

import contextlib
import contextvars

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import leaf

from _release import RELEASE, _calling_first, _seeded
from test_release_semantics import f_mul

pytestmark = pytest.mark.skipif(
    RELEASE is None, reason=f"torch {torch.__version__} is not a verified release"
)


# ---------------------------------------------------------------------------
# 1. the contextvars context of the compiled backward


def test_backward_context_between_nodes():
    """Two compiled nodes in one backward: on 2.13 each compiled backward runs
    in the backward's context itself, so a ContextVar the first sets is seen
    by the second; on 2.14 each runs in a copy, so it is not."""
    var = contextvars.ContextVar("torch_aot_rt_release_var", default="unset")
    results = {}
    for use_c in (False, True):
        _seeded()
        seen = []

        def observe():
            seen.append(var.get())
            var.set(f"set by backward {len(seen)}")

        bw_compiler = _calling_first(observe)

        with T.c_runtime(use_c, min_functions=2):
            g1 = aot_function(f_mul, fw_compiler=nop, bw_compiler=bw_compiler)
            g2 = aot_function(lambda a: (a.sin() * 2,), fw_compiler=nop, bw_compiler=bw_compiler)
            x, w = leaf(3, 3), leaf(3, 3)
            (y,) = g1(x, w)
            (z,) = g2(y)
        T.check_classes([z], use_c, expect=2)
        token = var.set("caller")
        try:
            z.sum().backward()
            after = var.get()
        finally:
            var.reset(token)
        results[use_c] = (seen, after, D.TensorValue(x.grad))
    D.assert_same(results[False], results[True])
    seen, after, _ = results[False]
    if not RELEASE.backward_runs_in_tls_context:
        # 2.11: no TLS context hook, both run in the caller's context
        assert (seen, after) == (["caller", "set by backward 1"], "set by backward 2")
        return
    assert after == "caller"
    if RELEASE.copies_backward_context:
        assert seen == ["caller", "caller"], seen
    else:
        assert seen == ["caller", "set by backward 1"], seen


# ---------------------------------------------------------------------------
# 2. saved opaque objects (is_opaque_type / OpaqueBase, renamed in 2.14)


def _opaque_base_class():
    """The base an opaque class must derive from: OpaqueBase in 2.13,
    CustomClassBase in 2.14 (the rename the C path has to follow)."""
    if RELEASE is None:  # the module's tests skip; it must still import
        return object
    try:
        from torch._custom_class_base import CustomClassBase as base
    except ImportError:
        from torch._opaque_base import OpaqueBase as base
    # None: 2.11 checks is_opaque_type alone (tests/aot/test_release_211.py)
    assert RELEASE.opaque_base in (base.__name__, None), (base, RELEASE.opaque_base)
    return base


class Counter(_opaque_base_class()):
    """A reference-type opaque object a custom op reads in its backward."""

    def __init__(self, scale):
        self.scale = scale


def _opaque_op():
    """A custom op taking an opaque object, whose backward needs it: the
    partitioner saves the object for backward."""
    from torch._library import opaque_object

    ns = "torch_aot_rt_test"
    if getattr(_opaque_op, "op", None) is not None:
        return _opaque_op.op
    if hasattr(opaque_object, "register_custom_class"):  # 2.14 name; the old one warns
        opaque_object.register_custom_class(Counter, typ="symbolic")
    else:
        opaque_object.register_opaque_type(Counter, typ="reference")
    name = opaque_object.get_opaque_type_name(Counter)

    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(f"scaled(Tensor x, {name} c) -> Tensor")

    def scaled_impl(x, c):
        return x * c.scale

    def scaled_fake(x, c):
        return torch.empty_like(x)

    lib.impl("scaled", scaled_impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{ns}::scaled", scaled_fake, lib=lib)

    def setup_context(ctx, inputs, output):
        ctx.c = inputs[1]

    def backward(ctx, grad):
        return torch.ops.torch_aot_rt_test.scaled(grad, ctx.c), None

    torch.library.register_autograd(
        f"{ns}::scaled", backward, setup_context=setup_context, lib=lib
    )
    _opaque_op.lib = lib
    _opaque_op.op = torch.ops.torch_aot_rt_test.scaled
    return _opaque_op.op


def test_saved_opaque_object():
    op = _opaque_op()

    def fn(x, c):
        return op(x.sin(), c) * 2

    results = {}
    for use_c in (False, True):
        _seeded()
        c = Counter(3.0)
        x = leaf(4)
        with T.c_runtime(use_c):
            cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
            out = cf(x, c)
        T.check_classes([out], use_c, expect=1)
        opaque = [type(o).__name__ for o in out.grad_fn.opaque_objects]
        c.scale = 5.0  # the backward reads the object it saved
        out.sum().backward()
        results[use_c] = (opaque, D.TensorValue(out), D.TensorValue(x.grad))
    D.assert_same(results[False], results[True])
    assert results[False][0] == ["Counter"], results[False][0]


# ---------------------------------------------------------------------------
# 3. compile_to_python captures the generated runtime-wrapper source


@pytest.mark.inductor
def test_compile_to_python():
    from torch._functorch import aot_autograd

    has = hasattr(aot_autograd, "compile_to_python")
    assert has == (RELEASE.source_capture_sink is not None)
    if not has:
        return

    class M(torch.nn.Module):
        def forward(self, x, y):
            y.add_(1)
            return x.sin() + y, x.view(-1)

    results = {}
    for use_c in (False, True):
        _seeded()
        gm = torch.fx.symbolic_trace(M())
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        before = __import__("torch_aot_rt").stats()
        with D.runtime(use_c):
            source, cache = aot_autograd.compile_to_python(gm, [x, y])
        after = __import__("torch_aot_rt").stats()
        fresh = {
            k: v - before["fallback_reasons"].get(k, 0)
            for k, v in after["fallback_reasons"].items()
            if v != before["fallback_reasons"].get(k, 0)
        }
        call = aot_autograd.load_from_python(source, cache)
        y2 = y.clone()
        outs = call([x, y2])
        results[use_c] = ([D.TensorValue(o) for o in outs], D.TensorValue(y2))
        if use_c and D.C_ENABLED:
            from torch_aot_rt._plan import SOURCE_CAPTURE

            assert fresh == {SOURCE_CAPTURE: 1}, fresh
            assert after["runtime_wrappers"] == before["runtime_wrappers"]
    D.assert_same(results[False], results[True])


# ---------------------------------------------------------------------------
# 4. a compiled forward returning one output too many


def test_forward_returns_one_output_too_many():
    """Upstream 2.14 raises IndexError (saved_tensor_is_graph_input has one
    entry per saved tensor); 2.13 saves the extra one. Either way, ours does
    what upstream does."""

    def fw_compiler(gm, example_inputs):
        def run(args):
            outs = list(gm(*args))
            return outs + [torch.zeros(2)]

        run._boxed_call = True
        return run

    results = {}
    for use_c in (False, True):
        _seeded()
        with T.c_runtime(use_c):  # aot_function compiles on the first call
            g = aot_function(f_mul, fw_compiler=fw_compiler, bw_compiler=nop)
            try:
                (out,) = g(leaf(3, 3), leaf(3, 3))
                rec = ("ok", D.TensorValue(out), T._safe(lambda: out.sum().backward()))
            except Exception as e:  # noqa: BLE001 - the exception is the observation
                rec = D.error_record(e)
        results[use_c] = rec
    D.assert_same(results[False], results[True])
    if RELEASE.keeps_saved_graph_inputs:
        assert results[False]["type"] == "IndexError", results[False]


# ---------------------------------------------------------------------------
# 5. the lazy backward compile under deferred_full_gc (2.15)


def test_lazy_backward_compile_defers_gc():
    """2.15 compiles the backward (lazily, at the first backward) under
    ``deferred_full_gc()``: the gen2 GC threshold is raised to at least
    ``torch._dynamo.config.gc_gen2_threshold_during_compile`` while the
    backward compiler runs, and put back after. The C backward calls
    upstream's ``get_or_compile``, so it inherits that: the same thresholds
    either way, and untouched on 2.13/2.14."""
    import gc

    import torch._dynamo.config as dynamo_config

    patch = (
        dynamo_config.patch(gc_gen2_threshold_during_compile=4321)
        if hasattr(dynamo_config, "gc_gen2_threshold_during_compile")
        else contextlib.nullcontext()
    )
    results = {}
    saved = gc.get_threshold()
    try:
        for use_c in (False, True):
            _seeded()
            gc.set_threshold(700, 10, 7)
            seen = []

            def bw_compiler(gm, example_inputs):
                seen.append(gc.get_threshold())
                return nop(gm, example_inputs)

            with patch:
                with T.c_runtime(use_c):
                    g = aot_function(f_mul, fw_compiler=nop, bw_compiler=bw_compiler)
                    (out,) = g(leaf(3, 3), leaf(3, 3))
                T.check_classes([out], use_c, expect=1)
                compiled_at_forward = list(seen)
                out.sum().backward()
            results[use_c] = (compiled_at_forward, seen, gc.get_threshold())
    finally:
        gc.set_threshold(*saved)
    assert results[False] == results[True], results
    compiled_at_forward, seen, after = results[False]
    assert compiled_at_forward == [] and after == (700, 10, 7), results[False]
    expect = (700, 10, 4321) if RELEASE.backward_compile_defers_gc else (700, 10, 7)
    assert seen == [expect], seen


# ---------------------------------------------------------------------------
# 6. 2.15's metadata and first-call changes, which reach the C path through
#    what upstream builds (no field): the C path must keep agreeing


def f_noop_view_of_output(x):
    a = x + 1
    return a, a.view(a.shape)


@pytest.mark.parametrize("mode", ["plain", "no_grad", "train"])
def test_noop_view_of_another_output(mode):
    """2.15 classifies a no-op view of another user output as
    ``alias_of_intermediate_base_is_user_output`` (regenerated per call; 2.14:
    ``non_alias``) when it does not require grad: the C epilogue regenerates
    it as upstream's does."""
    from _cases import ctx_for, inputs_for

    D.run_differential(
        f_noop_view_of_output, inputs_for([(3, 4)], mode), ctx=ctx_for(mode),
        compile="aot_eager", calls=2,
    )


def f_mutates_input_requiring_grad(x, w):
    x.mul_(2)
    return ((x * w).sin(),)


def test_epilogue_mutated_input_with_min_cut():
    """2.15 marks forward inputs that require grad and whose data mutation the
    runtime epilogue replays, and the min-cut partitioner never saves them:
    other saved tensors, other saved_tensor_is_graph_input."""
    from functorch.compile import min_cut_rematerialization_partition

    def inputs():
        x, base = T.nonleaf(3, 4)
        w = leaf(3, 4)
        return D.Inputs((x, w), (base, w))

    T.differential(
        f_mutates_input_requiring_grad, inputs, bw_compiler_factory=T.RecordingBackward,
        compile_kwargs={"partition_fn": min_cut_rematerialization_partition},
    )


class PlainSubclass(torch.Tensor):
    """A tensor subclass without its own __torch_dispatch__."""


def test_first_call_custom_op_check_sees_plain_subclasses():
    """2.15's first-call custom-op aliasing check analyses tensor subclasses
    without their own __torch_dispatch__; 2.13/2.14 returned NotImplemented for
    them (runtime_wrappers.HANDLED_TYPES), so the first call raises there. The
    C wrapper enters upstream's _FirstInvocationContext: the same either way."""
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    @torch.library.custom_op("torch_aot_rt_test::scale2", mutates_args=())
    def scale2(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @scale2.register_fake
    def _(x):
        return torch.empty_like(x)

    def f(x):
        return (scale2(x) + 1,)

    import re

    import torch_aot_rt

    results = {}
    for use_c in (False, True):
        _seeded()
        before = torch_aot_rt.stats()["runtime_wrappers"]
        with D.runtime(use_c):
            cf = torch.compile(f, backend="aot_eager")
            rec = []
            for _ in range(2):
                x = torch.randn(3).as_subclass(PlainSubclass)
                try:
                    (out,) = cf(x)
                    rec.append((type(out).__name__, D.TensorValue(out)))
                except Exception as e:  # noqa: BLE001 - the exception is the observation
                    # (the message names the mode object by address)
                    rec.append((type(e).__name__, re.sub(r"0x[0-9a-f]+", "0x?", str(e))))
        built = torch_aot_rt.stats()["runtime_wrappers"] - before
        results[use_c] = rec
        if D.C_ENABLED:
            assert built == (1 if use_c else 0), built
    D.assert_same(results[False], results[True])
    first = results[False][0][0]
    assert first == ("TypeError" if hasattr(rw, "HANDLED_TYPES") else "PlainSubclass"), results[False]
