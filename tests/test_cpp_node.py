"""CompiledFunction's C++ autograd node (csrc/cpp/compiled_node.cpp).

With the C++ part loaded, every C CompiledFunction call builds the C++ node
(``_training.check_classes`` asserts it in every CompiledFunction test of the
suite); with ``TORCH_AOT_RT_CPP=0`` the same tests run upstream's node with
the C forward/backward. These tests pin what is specific to the node, each
against upstream (C runtime off) in one process: its Python face, the
per-call decisions and their counts, the switches compiled autograd,
profiling and forward AD make, hooks, ``autograd.grad``, version-counter
errors, sequence numbers, node-creation hooks and when saved tensors die.
"""

from __future__ import annotations

import gc
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


def test_compiled_autograd_enabled_after_forward():
    """Compiled autograd switched on between a forward and its backward: the
    C++ node cannot be traced by it, so that backward raises a clear error
    (and leaves no gradient); upstream's node runs it. Never a wrong gradient."""
    from torch._dynamo import compiled_autograd

    def run(use_c):
        g = compile_fn(f_two, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        out = g(a, b)
        with compiled_autograd._enable(torch.compile(backend="eager")):
            err = T._safe(lambda: (out[0].sum() + out[1].sum()).backward())
        return err, a.grad, b.grad

    r = both(run)
    assert not isinstance(r[False][0], dict), r[False][0]  # upstream ran it
    if T.cpp_node_in_use():
        err, ga, gb = r[True]
        assert err["type"] == "NotImplementedError", err
        assert "compiled autograd was enabled after the forward" in err["message"]
        assert "TORCH_AOT_RT_CPP=0" in err["message"]
        assert ga is None and gb is None
    else:
        D.assert_same(D.TensorValue(r[False][1]), D.TensorValue(r[True][1]))


def test_forward_and_backward_under_compiled_autograd():
    """A forward while compiled autograd is enabled gets upstream's node
    (counted), and compiled autograd's backward gives upstream's gradients."""
    from torch._dynamo import compiled_autograd

    def run(use_c):
        g = compile_fn(f_two, use_c)
        a, b = leaf(3, 4), leaf(3, 4)
        before = T.node_stats()
        with compiled_autograd._enable(torch.compile(backend="eager")):
            out = g(a, b)
            T.check_classes(out, use_c, expect=1, cpp_node=False)
            (out[0].sum() + out[1].sum()).backward()
        if use_c and T.cpp_node_in_use():
            assert T.node_stats_delta(before) == {"compiled autograd enabled": 1}
        return D.TensorValue(a.grad), D.TensorValue(b.grad)

    r = both(run)
    D.assert_same(r[False], r[True], "grads")


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
