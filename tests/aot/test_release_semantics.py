"""What changes between the verified torch releases, C path off vs on.

Each test is differential (upstream's runtime vs ours, same process) and also
pins what upstream itself does on the installed release, read from the release
table (``torch_aot_rt._versions``): so each case fails on a release whose
semantics the C path does not mirror, and on a release whose entry is wrong.
"""

from __future__ import annotations

import contextlib
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

REGISTRY = RELEASE.external_objects_registry if RELEASE is not None else None
dict_registry = pytest.mark.skipif(
    REGISTRY == "list", reason=f"torch {RELEASE and RELEASE.name}: a list registry"
)
list_registry = pytest.mark.skipif(
    REGISTRY != "list", reason=f"torch {RELEASE and RELEASE.name}: no list registry"
)


class Obj:
    def __init__(self, name=""):
        self.name = name


def _names(refs):
    """What a registry (dict or list of weak references) holds, by name."""
    if isinstance(refs, dict):
        return {k: getattr(r(), "name", None) for k, r in refs.items()}
    return [getattr(r(), "name", None) for r in refs]


@contextlib.contextmanager
def _registries():
    """The registry runtime_wrappers imported, and (2.15) a *current* one of
    graph_bytecode_inputs, another list, as Dynamo leaves it once its pre-graph
    bytecode called store_user_object_weakrefs (which rebinds that module's
    global); keep_alive emptied. All put back afterwards. Yields
    ``(stale, current, keep_alive)``; on a dict release both are the one dict."""
    import torch._dynamo.graph_bytecode_inputs as gbi
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    stale = rw.__dict__.get("index_to_external_object_weakref", gbi.index_to_external_object_weakref)
    saved_stale = stale.copy()
    saved_current = gbi.index_to_external_object_weakref
    saved_keep = list(gbi.keep_alive)
    current = [] if isinstance(stale, list) else stale
    try:
        stale.clear()
        gbi.index_to_external_object_weakref = current
        gbi.keep_alive.clear()
        yield stale, current, gbi.keep_alive
    finally:
        stale.clear()
        stale.update(saved_stale) if isinstance(stale, dict) else stale.extend(saved_stale)
        gbi.index_to_external_object_weakref = saved_current
        gbi.keep_alive[:] = saved_keep


@dict_registry
def test_external_objects_snapshot_and_restore():
    """2.14 snapshots ``index_to_external_object_weakref`` onto ctx in the
    forward and restores it (weak references, in place) before the compiled
    backward runs: the backward sees the objects of its own forward, not what
    the registry holds later. 2.13 has neither."""
    results = {}
    for use_c in (False, True):
        _seeded()
        with _registries() as (reg, _, keep_alive):
            seen = []
            bw_compiler = _calling_first(lambda: seen.append(_names(reg)))
            first, later = Obj("first"), Obj("later")
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
            after = _names(reg)
            kept = len(keep_alive)
        results[use_c] = (snapshot, seen, after, kept)
    assert results[False] == results[True], results
    snapshot, seen, after, kept = results[False]
    assert kept == 0  # no strong reference taken
    if RELEASE.snapshots_external_objects:
        assert snapshot == {7: "first"}
        assert seen == [{7: "first", 8: "later"}] and after == {7: "first", 8: "later"}
    else:
        assert snapshot == "absent"
        assert seen == [{7: "later", 8: "later"}]


@dict_registry
def test_external_objects_dead_in_forward_are_skipped():
    """Registry entries whose object is gone are not snapshotted."""
    results = {}
    for use_c in (False, True):
        _seeded()
        with _registries() as (reg, _, _keep):
            alive, dead = Obj(), Obj()
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
        results[use_c] = (snapshot, after)
    assert results[False] == results[True], results
    if RELEASE.snapshots_external_objects:
        assert results[False][0] == [1]


@list_registry
def test_external_objects_list_snapshot_stale_restore_current():
    """2.15: the forward snapshots the list runtime_wrappers imported (stale
    once Dynamo has rebound graph_bytecode_inputs' global), keyed by position;
    the backward restores through set_external_object_by_index, which writes
    the module's *current* list (slot 0 overwritten here) and appends a strong
    reference to keep_alive. The stale list is left as it is. 2.14's behaviour
    (the dict it snapshots and writes weak references back into) fails every
    one of these."""
    results = {}
    for use_c in (False, True):
        _seeded()
        with _registries() as (stale, current, keep_alive):
            assert stale is not current
            seen = []
            bw_compiler = _calling_first(
                lambda: seen.append((_names(current), _names(stale), len(keep_alive)))
            )
            first, later, other = Obj("first"), Obj("later"), Obj("other")
            stale.append(weakref.ref(first))
            current.extend([weakref.ref(later), weakref.ref(other)])
            with T.c_runtime(use_c):
                g = aot_function(f_mul, fw_compiler=nop, bw_compiler=bw_compiler)
                out = g(leaf(3, 3), leaf(3, 3))
            T.check_classes(out, use_c, expect=1)
            ctx = out[0].grad_fn
            snapshot = {k: v.name for k, v in ctx._external_objects.items()}
            stale[0] = weakref.ref(later)  # the backward must not read it again
            out[0].sum().backward()
            after = (_names(current), _names(stale), [o.name for o in keep_alive])
        results[use_c] = (snapshot, seen, after)
    assert results[False] == results[True], results
    snapshot, seen, after = results[False]
    assert snapshot == {0: "first"}
    assert seen == [(["first", "other"], ["later"], 1)], seen
    assert after == (["first", "other"], ["later"], ["first"]), after


@list_registry
def test_external_objects_list_positions_append_and_past_the_end():
    """2.15: dead weak references are skipped, so snapshot keys are list
    positions with gaps; restoring into a shorter current list appends at
    ``idx == len`` and raises ``AssertionError`` past the end, before the
    compiled backward runs, after keep_alive took the object."""
    results = {}
    for use_c in (False, True):
        _seeded()
        with _registries() as (stale, current, keep_alive):
            ran = []
            bw_compiler = _calling_first(lambda: ran.append(True))
            a0, dead, a2 = Obj("a0"), Obj("dead"), Obj("a2")
            stale.extend([weakref.ref(a0), weakref.ref(dead), weakref.ref(a2)])
            del dead
            with T.c_runtime(use_c):
                g = aot_function(f_mul, fw_compiler=nop, bw_compiler=bw_compiler)
                out = g(leaf(3, 3), leaf(3, 3))
            T.check_classes(out, use_c, expect=1)
            snapshot = {k: v.name for k, v in out[0].grad_fn._external_objects.items()}
            err = T._safe(lambda: out[0].sum().backward())
            after = (_names(current), [o.name for o in keep_alive], ran)
        results[use_c] = (snapshot, err, after)
    D.assert_same(results[False], results[True])
    snapshot, err, after = results[False]
    assert snapshot == {0: "a0", 2: "a2"}
    assert err == {
        "type": "AssertionError",
        "message": "Index past the end of index_to_user_object_weakref",
    }, err
    assert after == (["a0"], ["a0", "a2"], []), after


@list_registry
def test_external_objects_list_snapshot_iterates_as_enumerate():
    """2.15: ``enumerate`` over a list that grows while it is read visits the
    new entries (the length is re-read at each step, no error), and calls each
    live reference twice, a dead one once; what the backward restores from a
    snapshot that is not a plain dict (or holds something that cannot be
    weakly referenced) raises as set_external_object_by_index does."""
    calls = []

    class Ref(weakref.ref):
        def __call__(self):
            calls.append(self.tag)
            if self.tag == "grow":
                self.tag = "grown"
                stale.append(_make_ref(late, "late"))
            return super().__call__()

    def _make_ref(obj, tag):
        r = Ref(obj)
        r.tag = tag
        return r

    results = {}
    for use_c in (False, True):
        _seeded()
        calls.clear()
        with _registries() as (stale, current, keep_alive):
            a, late, dead = Obj("a"), Obj("late"), Obj("dead")
            stale.extend([_make_ref(a, "grow"), _make_ref(dead, "dead")])
            del dead
            with T.c_runtime(use_c):
                g = aot_function(f_mul, fw_compiler=nop, bw_compiler=nop)
                out = g(leaf(3, 3), leaf(3, 3))
            T.check_classes(out, use_c, expect=1)
            ctx = out[0].grad_fn
            snapshot = {k: v.name for k, v in ctx._external_objects.items()}
            order = list(calls)
            ctx._external_objects = {0: a, "1": late}
            bad_key = T._safe(lambda: out[0].sum().backward(retain_graph=True))
            kept = [getattr(o, "name", o) for o in keep_alive]
            ctx._external_objects = {0: 5}
            bad_value = T._safe(lambda: out[0].sum().backward())
            kept_after = [getattr(o, "name", o) for o in keep_alive]
        results[use_c] = (snapshot, order, bad_key, kept, bad_value, kept_after)
    D.assert_same(results[False], results[True])
    snapshot, order, bad_key, kept, bad_value, kept_after = results[False]
    assert snapshot == {0: "a", 2: "late"}
    assert order == ["grow", "grown", "dead", "late", "late"], order
    assert bad_key["type"] == "TypeError" and kept == ["a", "late"], (bad_key, kept)
    assert bad_value["type"] == "TypeError" and kept_after[-1] == 5, (bad_value, kept_after)


@list_registry
def test_external_objects_plan_bits_match_the_bound_registry():
    """The plans carry the release's registry kind and restore mode; a plan
    that contradicts what was bound is refused when it is built."""
    from functorch.compile import aot_function as aot

    from torch_aot_rt import _autograd_plan

    if not D.C_ENABLED:
        pytest.skip("needs the C extension")
    seen = {}
    fwd, bwd = _autograd_plan._forward_plan, _autograd_plan._backward_plan

    def record(name, fn):
        def wrapper(*args):
            seen[name] = (args[0], fn(*args))
            return seen[name][1]

        return wrapper

    _seeded()
    _autograd_plan._forward_plan = record("forward", fwd)
    _autograd_plan._backward_plan = record("backward", bwd)
    try:
        with T.c_runtime(True):
            aot(f_mul, fw_compiler=nop, bw_compiler=nop)(leaf(3), leaf(3))
    finally:
        _autograd_plan._forward_plan, _autograd_plan._backward_plan = fwd, bwd
    cls, fplan = seen["forward"]
    _, bplan = seen["backward"]
    assert fplan["external_objects_list"] is True and bplan["restore_by_setter"] is True
    upstream_fwd = cls.__dict__["forward"].__func__
    upstream_bwd = cls.__dict__["backward"].__func__
    with pytest.raises(ValueError, match="external_objects_list is False, the registry bound is a list"):
        D._C.CompiledForward(upstream=upstream_fwd, **{**fplan, "external_objects_list": False})
    with pytest.raises(ValueError, match="restore_by_setter is False"):
        D._C.CompiledBackward(upstream=upstream_bwd, **{**bplan, "restore_by_setter": False})
    for key, plan, make, upstream in (
        ("external_objects_list", fplan, D._C.CompiledForward, upstream_fwd),
        ("restore_by_setter", bplan, D._C.CompiledBackward, upstream_bwd),
    ):
        make(upstream=upstream, **plan)  # the real plan is accepted
        with pytest.raises(ValueError, match=f"plan: {key} must be a bool"):
            make(upstream=upstream, **{**plan, key: 1})


EXTERNAL_OBJECTS_PROGRAM = r'''
import json, sys
import torch, torch._dynamo
import torch_aot_rt
from torch._dynamo.decorators import leaf_function
import torch._dynamo.graph_bytecode_inputs as gbi

@leaf_function
def apply_mod(mod, x):
    return (mod(x),)

@apply_mod.register_fake
def _(mod, x):
    return (mod(x),)

def f(mod, x):
    return apply_mod(mod, x * 2)[0].sin()

torch.manual_seed(0)
m1, m2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
names = {id(m1): "m1", id(m2): "m2"}
cf = torch.compile(f, backend="aot_eager", fullgraph=True)
x = torch.randn(2, 4, requires_grad=True)
rec = []
for m in (m1, m2, m1):
    out = cf(m, x)
    gf = out.grad_fn
    while gf is not None and not hasattr(gf, "_external_objects"):
        gf = gf.next_functions[0][0]
    snap = {str(k): names.get(id(v), "?") for k, v in gf._external_objects.items()}
    kept = len(gbi.keep_alive)
    out.sum().backward()
    current = [names.get(id(r()), "?") for r in (
        gbi.index_to_external_object_weakref.values()
        if isinstance(gbi.index_to_external_object_weakref, dict)
        else gbi.index_to_external_object_weakref)]
    rec.append([snap, current, len(gbi.keep_alive) - kept, x.grad.sum().item()])
s = torch_aot_rt.stats()
print(json.dumps(dict(rec=rec, functions=s["autograd_functions"], fallbacks=s["fallbacks"],
                      node=type(gf).__name__)))
'''


def test_external_objects_through_dynamo():
    """End to end, in fresh processes (the stale list is per process): an
    ``nn.Module`` passed to a ``leaf_function`` is a Dynamo external object.
    Called with m1, m2, m1: 2.14 snapshots the module of each call; 2.15
    snapshots m1 every time (the list runtime_wrappers imported is the one
    Dynamo registered m1 in at compile time, before its pre-graph bytecode
    rebound the global), its backward writes m1 into the current list (over
    m2) and keeps one strong reference per backward."""
    import json
    import os
    import subprocess
    import sys

    if not RELEASE.snapshots_external_objects:
        pytest.skip(f"torch {RELEASE.name} keeps no external objects on ctx")
    from _root import ROOT as root
    results = {}
    for use_c in (False, True):
        env = dict(os.environ, TORCH_AOT_RT="1" if use_c else "0",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-c", EXTERNAL_OBJECTS_PROGRAM], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[use_c] = json.loads(proc.stdout.strip().splitlines()[-1])
    off, on = results[False], results[True]
    assert off["functions"] == 0
    if D.C_ENABLED:
        assert on["functions"] >= 1 and on["fallbacks"] == 0, on
    assert on["rec"] == off["rec"], results
    snaps = [r[0] for r in off["rec"]]
    currents = [r[1] for r in off["rec"]]
    kept = [r[2] for r in off["rec"]]
    if REGISTRY == "list":
        assert snaps == [{"0": "m1"}] * 3, snaps
        assert currents == [["m1"]] * 3, currents
        assert kept == [1, 1, 1], kept
    else:
        assert snaps == [{"0": "m1"}, {"0": "m2"}, {"0": "m1"}], snaps
        assert currents == [["m1"], ["m2"], ["m1"]], currents
        assert kept == [0, 0, 0], kept


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
# 7. the lazy backward compile under deferred_full_gc (2.15)


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
# 8. 2.15's metadata and first-call changes, which reach the C path through
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


# ---------------------------------------------------------------------------
# reference counts of the release-dependent paths, over many calls


def test_release_paths_leak_nothing():
    """Snapshot/restore of external objects, the context copy and the
    graph-input mask, 500 forward+backward steps: no reference grows, but for
    the one strong reference per backward that 2.15's restore appends to
    graph_bytecode_inputs.keep_alive (upstream's own, until Dynamo next resets
    its tracking): exactly that many, released with keep_alive."""
    import gc
    import sys

    obj = Obj()
    with _registries() as (stale, current, keep_alive):
        if isinstance(stale, dict):
            stale[3] = weakref.ref(obj)
        else:
            stale.extend([weakref.ref(Obj()), weakref.ref(obj)])  # a dead entry first
            current.extend([weakref.ref(obj), weakref.ref(obj)])  # restored into slot 1
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
        keep_alive.clear()
        gc.collect()
        before = (sys.getrefcount(obj), sys.getrefcount(a), len(stale), len(current),
                  len(gc.get_objects()))
        for _ in range(500):
            step()
        gc.collect()
        after = (sys.getrefcount(obj), sys.getrefcount(a), len(stale), len(current),
                 len(gc.get_objects()))
        kept = len(keep_alive)
        assert all(o is obj for o in keep_alive)
        keep_alive.clear()
        released = sys.getrefcount(obj)
    per_backward = 1 if RELEASE.external_objects_setter is not None else 0
    assert kept == 500 * per_backward, kept
    assert after[0] - before[0] == kept and released == before[0], (before, after, released)
    assert before[1:4] == after[1:4], (before, after)
    assert after[4] - before[4] < 100, (before, after)


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
