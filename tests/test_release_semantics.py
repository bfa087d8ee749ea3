"""What changes between the verified torch releases, C path off vs on.

Each test is differential (upstream's runtime vs ours, same process) and also
pins what upstream itself does on the installed release, read from the release
table (``torch_aot_rt._versions``): so each case fails on a release whose
semantics the C path does not mirror, and on a release whose entry is wrong.
"""

from __future__ import annotations

import contextvars
import weakref

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import leaf
from torch_aot_rt import _versions

GATE = _versions.resolve(torch.__version__)
RELEASE = GATE.release
pytestmark = pytest.mark.skipif(
    RELEASE is None, reason=f"torch {torch.__version__} is not a verified release"
)


def _calling_first(observe):
    """A boxed compiler whose graph calls ``observe()`` before running: what
    the compiled backward sees when it runs."""

    def compiler(gm, example_inputs):
        def run(args):
            observe()
            return gm(*args)

        run._boxed_call = True
        return run

    return compiler


def _seeded(seed=0):
    torch._dynamo.reset()
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------
# 1. saved graph inputs that are views (_AutogradSavedState.save_from_forward)


def f_mul(a, b):
    return (a * b,)


@pytest.mark.parametrize("swap", ["data", "none"])
def test_saved_view_input(swap):
    """A graph input that is a view and is saved for backward: 2.13 saves a
    detached alias, 2.14 the input itself. A saved-tensor pack hook sees the
    difference, and so does the gradient once the input's ``.data`` is
    swapped between forward and backward."""
    results = {}
    for use_c in (False, True):
        _seeded()
        packed = []

        def pack(t):
            packed.append((tuple(t.shape), t._is_view(), t.requires_grad))
            return t

        base, b = leaf(4, 3), leaf(3, 3)
        a = base[1:]
        with T.c_runtime(use_c):
            g = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                (out,) = g(a, b)
        T.check_classes([out], use_c, expect=1)
        if swap == "data":
            a.data = torch.full_like(a, 5.0)
        out.sum().backward()
        results[use_c] = (packed, D.TensorValue(base.grad), D.TensorValue(b.grad))
    D.assert_same(results[False], results[True])
    a_records = [p for p in results[False][0] if p[0] == (3, 3)]
    # both inputs are saved: b (not a view) and a (a view, kept as is on 2.14)
    assert sorted(p[1] for p in a_records) == sorted(
        [False, RELEASE.keeps_saved_graph_inputs]
    ), a_records
    if swap == "data":
        # d(sum(a * b))/db is the saved a: the swapped data only where a is kept
        swapped = torch.equal(results[False][2].t, torch.full((3, 3), 5.0))
        assert swapped == RELEASE.keeps_saved_graph_inputs


# ---------------------------------------------------------------------------
# 2. Dynamo's external-object registry (_snapshot_external_objects)


def test_external_objects_snapshot_and_restore():
    """2.14 snapshots ``index_to_external_object_weakref`` onto ctx in the
    forward and restores it before the compiled backward runs: the backward
    sees the objects of its own forward, not what the registry holds later."""
    from torch._dynamo.graph_bytecode_inputs import index_to_external_object_weakref as reg

    class Obj:
        def __init__(self, name):
            self.name = name

    results = {}
    for use_c in (False, True):
        _seeded()
        seen = []

        bw_compiler = _calling_first(
            lambda: seen.append({k: getattr(r(), "name", None) for k, r in reg.items()})
        )

        first, later = Obj("first"), Obj("later")
        saved_registry = dict(reg)
        try:
            reg.clear()
            reg[7] = weakref.ref(first)
            with T.c_runtime(use_c):
                g = aot_function(f_mul, fw_compiler=nop, bw_compiler=bw_compiler)
                out = g(leaf(3, 3), leaf(3, 3))
            T.check_classes(out, use_c, expect=1)
            ctx = out[0].grad_fn
            snapshot = (
                {k: v.name for k, v in ctx._external_objects.items()}
                if hasattr(ctx, "_external_objects")
                else "absent"
            )
            reg[7] = weakref.ref(later)
            reg[8] = weakref.ref(later)
            out[0].sum().backward()
            after = {k: getattr(r(), "name", None) for k, r in reg.items()}
        finally:
            reg.clear()
            reg.update(saved_registry)
        results[use_c] = (snapshot, seen, after)
    assert results[False] == results[True], results
    snapshot, seen, after = results[False]
    if RELEASE.snapshots_external_objects:
        assert snapshot == {7: "first"}
        assert seen == [{7: "first", 8: "later"}] and after == {7: "first", 8: "later"}
    else:
        assert snapshot == "absent"
        assert seen == [{7: "later", 8: "later"}]


def test_external_objects_dead_in_forward_are_skipped():
    """Registry entries whose object is gone are not snapshotted."""
    from torch._dynamo.graph_bytecode_inputs import index_to_external_object_weakref as reg

    class Obj:
        pass

    results = {}
    for use_c in (False, True):
        _seeded()
        alive, dead = Obj(), Obj()
        saved_registry = dict(reg)
        try:
            reg.clear()
            reg[1] = weakref.ref(alive)
            reg[2] = weakref.ref(dead)
            del dead
            with T.c_runtime(use_c):
                g = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)
                out = g(leaf(3, 3), leaf(3, 3))
            ctx = out[0].grad_fn
            snapshot = sorted(getattr(ctx, "_external_objects", {"absent": 0}))
            out[0].sum().backward()
            after = sorted(k for k, r in reg.items() if r() is not None)
        finally:
            reg.clear()
            reg.update(saved_registry)
        results[use_c] = (snapshot, after)
    assert results[False] == results[True], results
    if RELEASE.snapshots_external_objects:
        assert results[False][0] == [1]


# ---------------------------------------------------------------------------
# 3. the contextvars context of the compiled backward


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
    assert after == "caller"
    if RELEASE.copies_backward_context:
        assert seen == ["caller", "caller"], seen
    else:
        assert seen == ["caller", "set by backward 1"], seen


# ---------------------------------------------------------------------------
# 4. saved opaque objects (is_opaque_type / OpaqueBase, renamed in 2.14)


def _opaque_base_class():
    """The base an opaque class must derive from: OpaqueBase in 2.13,
    CustomClassBase in 2.14 (the rename the C path has to follow)."""
    if RELEASE is None:  # the module's tests skip; it must still import
        return object
    try:
        from torch._custom_class_base import CustomClassBase as base
    except ImportError:
        from torch._opaque_base import OpaqueBase as base
    assert base.__name__ == RELEASE.opaque_base, (base, RELEASE.opaque_base)
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
# 5. compile_to_python captures the generated runtime-wrapper source


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
# 6. a compiled forward returning one output too many


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
# reference counts of the release-dependent paths, over many calls


def test_release_paths_leak_nothing():
    """Snapshot/restore of external objects, the context copy and the
    graph-input mask, 500 forward+backward steps: no reference grows."""
    import gc
    import sys

    from torch._dynamo.graph_bytecode_inputs import index_to_external_object_weakref as reg

    class Obj:
        pass

    obj = Obj()
    saved_registry = dict(reg)
    try:
        reg.clear()
        reg[3] = weakref.ref(obj)
        _seeded()
        with T.c_runtime(True):
            g = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)
            a, b = leaf(3, 3), leaf(3, 3)
            g(a[1:], b[1:])  # view inputs: saved graph inputs that are views

        def step():
            (out,) = g(a[1:], b[1:])
            out.sum().backward()

        for _ in range(20):
            step()
        gc.collect()
        before = (sys.getrefcount(obj), sys.getrefcount(a), len(reg), len(gc.get_objects()))
        for _ in range(500):
            step()
        gc.collect()
        after = (sys.getrefcount(obj), sys.getrefcount(a), len(reg), len(gc.get_objects()))
    finally:
        reg.clear()
        reg.update(saved_registry)
    assert before[:3] == after[:3], (before, after)
    assert after[3] - before[3] < 100, (before, after)
