"""CompiledFunction's C++ autograd node (csrc/cpp/compiled_node.cpp).

With the C++ part loaded, every C CompiledFunction call builds the C++ node
(``_training.check_classes`` asserts it in every CompiledFunction test of the
suite); with ``TORCH_AOT_RT_CPP=0`` the same tests run upstream's node with
the C forward/backward. These tests pin what is specific to the node, each
against upstream (C runtime off) in one process: its Python face, the
per-call decisions and their counts, the switches profiling and forward AD
make (compiled autograd: tests/aot/test_compiled_autograd.py), hooks, ``autograd.grad``, version-counter
errors, sequence numbers, node-creation hooks and when saved tensors die.
"""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
import torch_aot_rt
from _training import leaf

pytestmark = pytest.mark.needs_c


def f_two(a, b):
    return a * b + 1, (a @ b.t()).sin()


def f_uses_first(a, b):
    return (a.sin() * 2,)


def compile_fn(fn, use_c):
    """aot_function of ``fn`` (of two 3x4 leaves), compiled (by a first call)
    with the C runtime on or off."""
    torch._dynamo.reset()
    with T.c_runtime(use_c):
        g = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        g(leaf(3, 4), leaf(3, 4))
    return g


def both(run):
    """``run(use_c)`` with the C runtime off, then on, each from the same
    random seed: the two results."""
    out = {}
    for use_c in (False, True):
        torch.manual_seed(0)
        out[use_c] = run(use_c)
    return out


def test_grad_fn_face():
    """grad_fn's type name, name(), next_functions, Node isinstance, and the
    attributes the backward reads; the C++ node's type is registered as
    torch._C._functions.CompiledFunctionBackward."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        out = g(a, b)
        gf = out[0].grad_fn
        T.check_classes(out, use_c, expect=1)
        return {
            "type_name": type(gf).__name__,
            "name": gf.name(),
            "is_node": isinstance(gf, torch.autograd.graph.Node),
            "next": [(type(fn).__name__, nr) for fn, nr in gf.next_functions],
            "next_vars": [fn.variable is x for (fn, _), x in zip(gf.next_functions, (a, b))],
            "same_for_outputs": out[1].grad_fn is gf or out[1].grad_fn == gf,
            "requires_grad": gf.requires_grad if hasattr(gf, "requires_grad") else None,
            "forward_cls": gf._forward_cls.__name__,
            "n_saved": len(gf.saved_tensors),
            "materialize_non_diff": gf._materialize_non_diff_grads,
            "metadata": dict(gf.metadata),
            "cpp": type(gf) is getattr(torch._C._functions, "CompiledFunctionBackward", None),
        }

    r = both(run)
    cpp = r[True].pop("cpp")
    assert not r[False].pop("cpp")
    assert cpp == T.cpp_node_in_use()
    D.assert_same(r[False], r[True], "grad_fn")


def test_calls_counted():
    """stats()['cpp_node'] counts each call by decision."""
    g = compile_fn(f_two, True)
    before = T.node_stats()
    for _ in range(3):
        g(leaf(3, 4), leaf(3, 4))
    with torch.no_grad():
        g(leaf(3, 4), leaf(3, 4))
    delta = T.node_stats_delta(before)
    if T.cpp_node_in_use():
        assert delta == {"taken": 4}, delta
    else:
        assert delta == {}, delta
    assert torch_aot_rt.stats()["cpp_node"] == T.node_stats()


def test_profiler_declines_and_records_the_same_events():
    """Under the profiler (RecordFunction callbacks) the call goes to
    upstream's Function.apply, so the recorded events and their input shapes
    are upstream's."""

    def run(use_c):
        g = compile_fn(f_two, use_c)  # compiled outside the profile
        before = T.node_stats()
        with torch.profiler.profile(record_shapes=True) as prof:
            out = g(leaf(3, 4), leaf(3, 4))
            (out[0].sum() + out[1].sum()).backward()
        T.check_classes(out, use_c, expect=1, cpp_node=False)
        if use_c and T.cpp_node_in_use():
            assert T.node_stats_delta(before) == {
                "profiler or RecordFunction callbacks active": 1
            }
        names = sorted(
            (e.name, str(e.input_shapes)) for e in prof.events() if "Compiled" in e.name
        )
        return names

    r = both(run)
    assert r[False], "upstream recorded no CompiledFunction event"
    D.assert_same(r[False], r[True], "events")


def test_forward_ad_input_declines():
    """An input with a forward-mode tangent: upstream's Function.apply (its
    jvp error), counted."""
    import torch.autograd.forward_ad as fwAD

    def run(use_c):
        g = compile_fn(f_two, use_c)
        before = T.node_stats()
        with fwAD.dual_level():
            a = fwAD.make_dual(leaf(3, 4), torch.ones(3, 4))
            err = T._safe(lambda: g(a, leaf(3, 4)))
        if use_c and T.cpp_node_in_use():
            assert T.node_stats_delta(before) == {"forward-mode AD input": 1}
        return err

    r = both(run)
    assert r[False]["type"] == "NotImplementedError", r[False]
    D.assert_same(r[False], r[True], "error")


def test_node_and_tensor_hooks():
    """Hooks on the node (pre and post) and on its output tensors: called in
    the same order with the same gradients, and their results used."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        out = g(a, b)
        seen = []
        gf = out[0].grad_fn
        gf.register_prehook(lambda gos: seen.append(("pre", [D.TensorValue(x) for x in gos])))
        gf.register_hook(
            lambda gis, gos: seen.append(("post", [D.TensorValue(x) for x in gis]))
        )
        out[0].register_hook(lambda gr: gr * 3)
        out[1].register_hook(lambda gr: seen.append(("t1", D.TensorValue(gr))))
        torch.autograd.backward(out, [torch.ones(3, 4), torch.full((3, 3), 2.0)])
        return seen, D.TensorValue(a.grad), D.TensorValue(b.grad)

    r = both(run)
    D.assert_same(r[False], r[True], "hooks")


def test_autograd_grad_allow_unused():
    """torch.autograd.grad over an input the graph does not use: None with
    allow_unused, upstream's error without it."""

    def run(use_c):
        g = compile_fn(f_uses_first, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        (out,) = g(a, b)
        ok = torch.autograd.grad(out.sum(), [a, b], allow_unused=True, retain_graph=True)
        err = T._safe(lambda: torch.autograd.grad(out.sum(), [a, b]))
        return [D.TensorValue(x) if x is not None else None for x in ok], err

    r = both(run)
    assert r[False][0][1] is None and r[False][1]["type"] == "RuntimeError"
    D.assert_same(r[False], r[True], "grad")


def test_saved_input_modified_in_place():
    """A saved input modified after the forward: the backward's version
    error, word for word."""

    def f(a, b):
        return ((a * b).sum(),)

    def run(use_c):
        g = compile_fn(f, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        x = a * 1  # a non-leaf input, modifiable in place
        (out,) = g(x, b)
        with torch.no_grad():
            x.add_(1)
        return T._safe(lambda: out.backward())

    r = both(run)
    assert r[False]["type"] == "RuntimeError" and "inplace" in r[False]["message"], r[False]
    D.assert_same(r[False], r[True], "error")


def test_sequence_numbers():
    """The node takes the next sequence number (the engine's order among
    nodes ready at once, the profiler's forward/backward link)."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        pre = a * 1
        out = g(pre, b)
        post = out[0] * 1
        return (
            out[0].grad_fn._sequence_nr() - pre.grad_fn._sequence_nr(),
            post.grad_fn._sequence_nr() - out[0].grad_fn._sequence_nr(),
        )

    r = both(run)
    D.assert_same(r[False], r[True], "sequence_nr")


@pytest.mark.skipif(
    not hasattr(torch.autograd.graph, "node_creation_hook"),
    reason="torch.autograd.graph.node_creation_hook is new in 2.14",
)
def test_node_creation_hook():
    """2.14's node-creation hooks see the CompiledFunction node once, with
    its saved tensors in place."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        seen = []

        def hook(node):
            if T.is_compiled_function_node(node):
                seen.append((node.name(), len(node.saved_tensors)))

        with torch.autograd.graph.node_creation_hook(hook):
            out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        return seen

    r = both(run)
    assert r[False], "upstream fired no hook for the CompiledFunction node"
    D.assert_same(r[False], r[True], "creation hooks")


class Held:
    """What a pack hook returns: weakly referenceable, to see it die."""

    def __init__(self, t):
        self.t = t


def test_saved_tensors_die_when_upstreams_do():
    """Saved tensors (through pack hooks, so their lifetime is visible) die
    after a backward without retain_graph; with retain_graph they live until
    the graph does."""

    def run(use_c, retain):
        g = compile_fn(f_two, use_c)
        held = []

        def pack(t):
            h = Held(t)
            held.append(weakref.ref(h))
            return h

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
            out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        (out[0].sum() + out[1].sum()).backward(retain_graph=retain)
        gc.collect()
        after_backward = [w() is not None for w in held]
        del out
        gc.collect()
        return len(held), after_backward, [w() is not None for w in held]

    for retain in (False, True):
        r = {use_c: run(use_c, retain) for use_c in (False, True)}
        assert r[False][0] > 0
        D.assert_same(r[False], r[True], f"lifetimes (retain_graph={retain})")


# ---------------------------------------------------------------------------
# ctx.input_grad_buffers (2.15): the engine's buffers of the forward's inputs


def _release():
    from torch_aot_rt import _versions

    return _versions.resolve(torch.__version__).release


def _buffers_record(gf):
    """``gf.input_grad_buffers`` as values (or its error), and whether
    ``_input_grad_buffers`` reads the same."""
    try:
        bufs = gf.input_grad_buffers
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return D.error_record(e)
    again = gf._input_grad_buffers
    return {
        "values": [None if t is None else D.TensorValue(t.clone()) for t in bufs],
        "same": [x is y or (x is not None and y is not None and x.data_ptr() == y.data_ptr())
                 for x, y in zip(bufs, again)],
    }


def _observing(observe):
    """A boxed bw_compiler whose compiled backward calls ``observe()`` first."""

    def bw_compiler(gm, example_inputs):
        def run(args):
            observe()
            return gm(*args)

        run._boxed_call = True
        return run

    return bw_compiler


def test_input_grad_buffers_present_per_release():
    rel = _release()
    if rel is None:
        pytest.skip(f"torch {torch.__version__} is not a verified release")

    def run(use_c):
        g = compile_fn(f_two, use_c)
        out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        # on the type: reading it outside a backward raises RuntimeError
        names = set().union(*(vars(k) for k in type(out[0].grad_fn).__mro__))
        return ["input_grad_buffers" in names, "_input_grad_buffers" in names]

    r = both(run)
    D.assert_same(r[False], r[True], "hasattr")
    assert r[False] == [rel.has_input_grad_buffers] * 2, r[False]


@pytest.mark.skipif(
    not hasattr(torch._C._FunctionBase, "_input_grad_buffers"),
    reason="ctx.input_grad_buffers is new in 2.15",
)
def test_input_grad_buffers():
    """Read from the node's grad_fn while its compiled backward runs: one entry
    per forward argument, the engine's current buffer (here the contribution
    of an op that ran first) or None; a buffer accumulated into in place
    reaches .grad. And every refusal upstream's getter makes, with its
    message: outside backward, another node's, a post-hook on the node,
    create_graph, anomaly mode."""

    def run(use_c, case):
        torch._dynamo.reset()
        torch.manual_seed(0)
        holder = {"seen": []}

        def observe():
            gf = holder["other"] if case == "other_node" else holder["gf"]
            rec = _buffers_record(gf)
            holder["seen"].append(rec)
            if case == "accumulate" and "values" in rec:
                buf = gf.input_grad_buffers[0]
                if buf is not None:
                    buf.add_(100.0)

        with T.c_runtime(use_c, min_functions=2 if case == "other_node" else 1):
            g = aot_function(lambda a, b: (a * b,), fw_compiler=nop,
                             bw_compiler=_observing(observe))
            a, b = leaf(3), leaf(3)
            (out,) = g(a, b)
            if case == "other_node":
                g2 = aot_function(lambda a: (a.cos(),), fw_compiler=nop, bw_compiler=nop)
                (out2,) = g2(leaf(3))
                holder["other"] = out2.grad_fn
        T.check_classes([out], use_c, expect=1)
        holder["gf"] = gf = out.grad_fn
        if case == "post_hook":
            gf.register_hook(lambda gis, gos: None)
        loss = out.sum() + (a * 3).sum()  # (a * 3) runs first: a's buffer exists
        if case == "create_graph":
            err = T._safe(lambda: loss.backward(create_graph=True))
        elif case == "anomaly":
            with torch.autograd.detect_anomaly(check_nan=False):
                err = T._safe(loss.backward)
        else:
            err = T._safe(loss.backward)
        outside = _buffers_record(gf)
        grads = [None if t.grad is None else D.TensorValue(t.grad) for t in (a, b)]
        return holder["seen"], err, outside, grads

    cases = ["plain", "accumulate", "post_hook", "other_node", "create_graph", "anomaly"]
    for case in cases:
        r = {use_c: run(use_c, case) for use_c in (False, True)}
        D.assert_same(r[False], r[True], f"input_grad_buffers ({case})")
        seen, err, outside, grads = r[False]
        # the post-hook check comes first, in backward or not
        expect_outside = (
            "does not support post-hooks" if case == "post_hook"
            else "while autograd is executing backward"
        )
        assert outside["type"] == "RuntimeError" and expect_outside in outside["message"], (
            case, outside
        )
        (inside,) = seen
        if case in ("plain", "accumulate"):
            assert err is None, err
            assert inside["values"][1] is None and inside["values"][0] is not None, inside
        else:
            expect = {
                "post_hook": "does not support post-hooks on the producing autograd node",
                "other_node": "from the currently executing autograd.Function backward()",
                "create_graph": "does not support create_graph=True",
                "anomaly": "does not support anomaly detection",
            }[case]
            assert inside["type"] == "RuntimeError" and expect in inside["message"], (case, inside)
    # accumulated in place: the 100 reached a.grad
    plain, acc = run(False, "plain")[3], run(False, "accumulate")[3]
    assert torch.equal(acc[0].t - plain[0].t, torch.full((3,), 100.0)), (plain, acc)


@pytest.mark.skipif(
    not hasattr(torch._C._FunctionBase, "_input_grad_buffers"),
    reason="ctx.input_grad_buffers is new in 2.15",
)
def test_input_grad_buffers_non_tensor_arguments():
    """A CompiledFunction with SymInt arguments (dynamic shapes): None for
    each argument that is not a tensor, at its position."""

    def fn(x, w):
        return (x * w).sin().sum(0)

    def run(use_c):
        torch._dynamo.reset()
        holder = {"seen": []}
        observe = lambda: holder["seen"].append(_buffers_record(holder["gf"]))  # noqa: E731
        backend = aot_autograd_backend(bw_compiler=_observing(observe))
        x, w = leaf(5, 3), leaf(5, 3)
        with T.c_runtime(use_c):
            out = torch.compile(fn, backend=backend, dynamic=True)(x, w)
        T.check_classes([out], use_c, expect=1)
        (node,) = T.compiled_function_nodes([out])
        holder["gf"] = node
        (out.sum() + (x * 2).sum()).backward()
        return holder["seen"], [D.TensorValue(x.grad), D.TensorValue(w.grad)]

    r = both(run)
    D.assert_same(r[False], r[True], "input_grad_buffers with SymInts")
    ((inside,), _) = r[False]
    values = inside["values"]
    assert None in values and any(v is not None for v in values), inside


def aot_autograd_backend(**kwargs):
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=nop, **kwargs)


# ---------------------------------------------------------------------------
# garbage collection: what forward stores on the ctx takes part in it, as
# upstream's ctx.__dict__ does


class Back:
    """A Python object with a reference back into the autograd graph."""


def _opaque():
    """The opaque class and custom op of test_release_compiled_function (registered
    once per process), or a skip where the release has no opaque objects."""
    rs = pytest.importorskip("test_release_compiled_function")
    if rs.RELEASE is None:
        pytest.skip("not a verified release")
    return rs.Counter, rs._opaque_op()


def _opaque_cycle(use_c, refers_to, keep):
    """Compile and run `op(x.sin(), c) * 2` with an opaque object c, which the
    partitioner saves for backward (ctx.opaque_objects), then make c refer
    back to the output, to its grad_fn, or to a Python object holding the
    output. Drop everything but ``keep`` ("nothing", "output", "grad_fn"),
    collect, and say what survived; then what a backward through the kept
    object computes."""
    Counter, op = _opaque()

    def fn(x, c):
        return op(x.sin(), c) * 2

    torch._dynamo.reset()
    torch.manual_seed(0)
    x = leaf(4)
    with T.c_runtime(use_c):
        cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
        # compiled with another object: what the compile traced with stays
        # referenced from its artifacts (FakeScriptObjects in graph metadata)
        cf(x, Counter(2.0))
    c = Counter(3.0)
    out = cf(x, c)
    T.check_classes([out], use_c, expect=1)
    assert [type(o).__name__ for o in out.grad_fn.opaque_objects] == ["Counter"]
    if refers_to == "output":
        c.back = out
    elif refers_to == "grad_fn":
        c.back = out.grad_fn
    else:
        holder = Back()
        holder.out = out
        c.back = holder
        del holder
    alive = weakref.ref(c)
    out_alive = weakref.ref(out)
    kept = {"nothing": None, "output": out, "grad_fn": out.grad_fn}[keep]
    del c, out, cf
    torch._dynamo.reset()
    gc.collect()
    record = {"opaque_alive": alive() is not None, "output_alive": out_alive() is not None}
    if keep == "output":
        kept.sum().backward()
        record["grad"] = D.TensorValue(x.grad)
    elif keep == "grad_fn":
        record["opaque_of_kept"] = [type(o).__name__ for o in kept.opaque_objects]
    del kept
    gc.collect()
    record["opaque_alive_at_end"] = alive() is not None
    return record


@pytest.mark.parametrize("refers_to", ["output", "grad_fn", "holder"])
def test_cycle_through_saved_opaque_object_is_collected(refers_to):
    """An opaque object saved for backward that refers back to the output,
    its grad_fn, or an object holding the output: a reference cycle through
    what forward stored on the ctx. Upstream's collects it (the ctx's
    __dict__ takes part in gc); so must the C++ node's face, whose node
    keeps those objects in C++ fields."""
    r = both(lambda use_c: _opaque_cycle(use_c, refers_to, "nothing"))
    assert not r[False]["opaque_alive"], "upstream kept the cycle alive: the test proves nothing"
    D.assert_same(r[False], r[True], f"cycle through the opaque object ({refers_to})")


@pytest.mark.parametrize("keep", ["output", "grad_fn"])
@pytest.mark.parametrize("refers_to", ["output", "grad_fn"])
def test_cycle_kept_alive_is_not_collected(refers_to, keep):
    """The same cycle while something outside it holds the output or its
    grad_fn: a collection frees nothing, and the backward (or the grad_fn's
    attributes) still see the saved object; once that is dropped too, the
    cycle is freed."""
    r = both(lambda use_c: _opaque_cycle(use_c, refers_to, keep))
    assert r[False]["opaque_alive"] and not r[False]["opaque_alive_at_end"], r[False]
    D.assert_same(r[False], r[True], f"kept {keep} (cycle through {refers_to})")


def test_saved_objects_freed_without_cycles_over_many_calls():
    """No cycle: every node's saved objects die with its output, without a
    collection, call after call (no leak in the GC support): the saved
    opaque object's reference count is back where it was."""
    Counter, op = _opaque()

    def fn(x, c):
        return op(x.sin(), c) * 2

    def run(use_c):
        torch._dynamo.reset()
        c = Counter(1.0)
        with T.c_runtime(use_c):
            cf = torch.compile(fn, backend="aot_eager", fullgraph=True)
            cf(leaf(4), c)
        gc.collect()
        gc.disable()
        try:
            before = sys.getrefcount(c)
            for _ in range(50):
                out = cf(leaf(4), c)
                T.check_classes([out], use_c, expect=1)
                del out
            return sys.getrefcount(c) - before
        finally:
            gc.enable()

    r = both(run)
    D.assert_same(r[False], r[True], "opaque objects alive after their outputs died")


# ---------------------------------------------------------------------------
# the grad_fn's life: one object for the node's life, weakly referenceable,
# and once the node is gone (its outputs died) a held grad_fn keeps the ctx
# state and raises upstream's errors for what needs the node. Upstream's
# grad_fn is the ctx the node owns (a THPFunction); the C++ node's is a face
# with that ownership where the node owns its face (2.11/2.12, node_ptr.h),
# else torch's THPCppFunction, which owns the node: there, these tests check
# the documented differences instead (docs/compatibility.md).


def node_owns_face() -> bool:
    """Whether the C++ node in use owns its grad_fn (THPFunction's shape)."""
    if not T.cpp_node_in_use():
        return False
    import importlib

    name = torch_aot_rt.stats()["cpp"]["module"]
    return bool(importlib.import_module(f"torch_aot_rt.{name}").node_owns_face)


def _attempt(fn):
    """``fn()`` as a value, or its error (type and message)."""
    try:
        return {"value": fn()}
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return D.error_record(e)


def test_grad_fn_identity_and_weak_reference():
    """The same grad_fn object for the node's life (after every Python
    reference to it died), a weak reference to it that lives as long as the
    node, type name and module, not callable."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        gf = out[0].grad_fn
        ref = _attempt(lambda: weakref.ref(gf))
        rec = {
            "is_second_output's": out[0].grad_fn is out[1].grad_fn,
            "callable": callable(gf),
            "type": (type(gf).__name__, type(gf).__module__),
        }
        del gf
        gc.collect()
        if "value" in ref:
            # the object the dropped reference named, alive and still the grad_fn
            w = ref["value"]
            rec["same_object"] = w() is not None and w() is out[0].grad_fn
            del out
            gc.collect()
            rec["weakref_after_outputs_died"] = w() is not None
        else:
            rec["weakref"] = ref
        return rec

    r = both(run)
    assert r[False]["same_object"], r[False]
    assert not r[False]["weakref_after_outputs_died"], r[False]
    if T.cpp_node_in_use() and not node_owns_face():
        # 2.13 on: torch's THPCppFunction (documented): callable, a type of
        # torch._C._functions; weak references as upstream's
        c = r[True]
        assert c.pop("callable") and not r[False].pop("callable"), c
        assert c["type"][0] == r[False]["type"][0], (c, r[False])
        c["type"] = r[False]["type"]  # the module: torch._C._functions
    D.assert_same(r[False], r[True], "grad_fn identity")


# What a held grad_fn answers once its outputs died (name, getter or method
# with its arguments); register_hook's callable is made per run.
_HELD_PROBES = [
    ("name", lambda gf: gf.name()),
    ("next_functions", lambda gf: [(type(f).__name__, n) for f, n in gf.next_functions]),
    ("metadata", lambda gf: dict(gf.metadata)),
    ("_input_metadata", lambda gf: [(tuple(m.shape), str(m.dtype), str(m.device))
                                     for m in gf._input_metadata]),
    ("_sequence_nr", lambda gf: gf._sequence_nr() >= 0),
    ("_set_sequence_nr", lambda gf: gf._set_sequence_nr(7)),
    ("register_hook", lambda gf: type(gf.register_hook(lambda *a: None)).__name__),
    ("register_prehook", lambda gf: type(gf.register_prehook(lambda *a: None)).__name__),
    ("saved_tensors", lambda gf: len(gf.saved_tensors)),
    ("symints", lambda gf: list(gf.symints)),
    ("_forward_cls", lambda gf: gf._forward_cls.__name__),
    ("to_save", lambda gf: gf.to_save),
    ("non_differentiable", lambda gf: gf.non_differentiable),
    ("_materialize_non_diff_grads", lambda gf: gf._materialize_non_diff_grads),
    ("requires_grad", lambda gf: gf.requires_grad),
    ("maybe_clear_saved_tensors", lambda gf: gf.maybe_clear_saved_tensors()),
]


@pytest.mark.parametrize("backward_first", [False, True])
def test_held_grad_fn_after_outputs_died(backward_first):
    """A grad_fn held after its outputs died. On 2.11/2.12 its node died with
    them: what needs the node raises upstream's error word for word
    (``Attribute 'next_functions' is invalid ...``, the anomaly-metadata
    message), the ctx state stays readable, saved tensors are freed; from
    2.13 on the grad_fn keeps its node (upstream's ctx too). With or without
    a backward first."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        if backward_first:
            (out[0].sum() + out[1].sum()).backward()
        gf = out[0].grad_fn
        alive = {name: _attempt(lambda p=probe: p(gf)) for name, probe in _HELD_PROBES}
        del out
        gc.collect()
        return alive, {name: _attempt(lambda p=probe: p(gf)) for name, probe in _HELD_PROBES}

    r = both(run)
    _, died = r[False]
    if node_owns_face():
        # 2.11/2.12: upstream's ctx holds its node weakly
        assert died["next_functions"]["type"] == "RuntimeError", died
        assert "Attribute 'next_functions' is invalid" in died["next_functions"]["message"]
    D.assert_same(r[False], r[True], "held grad_fn")


def test_anomaly_metadata():
    """Anomaly mode's forward trace on the node (grad_fn.metadata): the same
    keys, and the same node name when a backward fails under it."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        with torch.autograd.detect_anomaly(check_nan=False):
            out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        gf = out[0].grad_fn
        return sorted(gf.metadata), gf.metadata is out[1].grad_fn.metadata

    r = both(run)
    assert r[False][0], r[False]
    D.assert_same(r[False], r[True], "metadata")


def test_apply_by_hand():
    """grad_fn.apply(*grads): the backward called by hand, as the release's
    BackwardCFunction calls it (unboxed on 2.11/2.12: backward(ctx,
    *grads)); apply_boxed exactly where upstream's ctx has it."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        gf = out[0].grad_fn
        grads = _attempt(lambda: [D.TensorValue(t) for t in
                                  gf.apply(torch.ones(3, 4), torch.ones(3, 3))])
        return grads, hasattr(gf, "apply_boxed")

    r = both(run)
    assert "value" in r[False][0], r[False]
    D.assert_same(r[False], r[True], "apply")


def test_cycle_through_grad_fn_and_output_hook_dict():
    """A cycle through a tensor hook on an output (the hook holds the output):
    collected or kept exactly as upstream's."""

    def run(use_c):
        g = compile_fn(f_two, use_c)
        out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        first = out[0]
        first.register_hook(lambda gr, keep=first: gr)
        w = _attempt(lambda: weakref.ref(first.grad_fn))
        wt = weakref.ref(first)
        del out, first
        gc.collect()
        return {"tensor_alive": wt() is not None, "grad_fn_alive": w["value"]() is not None}

    r = both(run)
    D.assert_same(r[False], r[True], "hook cycle")
