"""What changes between the verified torch releases, C path off vs on.

Each test is differential (upstream's runtime vs ours, same process) and also
pins what upstream itself does on the installed release, read from the release
table (``torch_aot_rt._versions``): so each case fails on a release whose
semantics the C path does not mirror, and on a release whose entry is wrong.

Here: saved graph inputs that are views, Dynamo's external-object
registry, and reference counts of the release-dependent paths;
CompiledFunction's release changes are in test_release_compiled_function.py,
2.12's and 2.11's plan bits in test_release_212.py and test_release_211.py.
"""

from __future__ import annotations

import contextlib
import weakref

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import leaf

from _release import RELEASE, _calling_first, _seeded

pytestmark = pytest.mark.skipif(
    RELEASE is None, reason=f"torch {torch.__version__} is not a verified release"
)


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
