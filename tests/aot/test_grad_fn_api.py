"""A compiled output's grad_fn through the public autograd API that takes
one (torch.autograd.graph, GradientEdge, multi-grad hooks, node hooks,
weak references, the ctx attributes code outside reads), upstream's ctx
(C runtime off) against the C runtime's (the C++ node's face where the C++
part is loaded): every answer, every error and every gradient the same.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.autograd.graph import Node, get_gradient_edge, register_multi_grad_hook

import _differential as D
import _training as T

pytestmark = pytest.mark.needs_c


def three(x, w):
    return (x * w).exp(), (x @ w.t()).cos(), x.sin() * 2


def _compiled(use_c):
    """A compiled function of two leaves with three outputs sharing one
    CompiledFunction node, called once: (outputs, leaves)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w = T.leaf(3, 4), T.leaf(3, 4)
    with T.c_runtime(use_c):
        f = torch.compile(three, backend="aot_eager")
        out = f(x, w)
    T.check_classes(out, use_c, expect=1)
    return out, (x, w)


def _grads(leaves):
    return [D.TensorValue(t.grad) if t.grad is not None else None for t in leaves]


def _values(ts):
    return [D.TensorValue(t) if isinstance(t, torch.Tensor) else t for t in ts]


def both(run):
    r = {use_c: run(use_c) for use_c in (False, True)}
    D.assert_same(r[False], r[True])
    return r[False]


@pytest.mark.parametrize("mode", ["all", "any"])
@pytest.mark.parametrize("used", ["every", "partial"])
def test_multi_grad_hook(mode, used):
    """register_multi_grad_hook over the outputs ("all" asks the engine
    whether each output's grad_fn will run: _will_engine_execute_node);
    ``partial``: the loss leaves one output out of the graph."""

    def run(use_c):
        (a, b, c), leaves = _compiled(use_c)
        seen = []

        def hook(grads):
            if mode == "all":
                seen.append([None if g is None else D.TensorValue(g) for g in grads])
            else:
                seen.append(D.TensorValue(grads))

        handle = register_multi_grad_hook((a, b, c), hook, mode=mode)
        loss = a.sum() * 2 + b.sum() + (0 if used == "partial" else c.sum())
        err = T._safe(loss.backward)
        handle.remove()
        return seen, err, _grads(leaves)

    r = both(run)
    assert r[0] and r[1] is None, r


def test_will_engine_execute_node():
    """_will_engine_execute_node(grad_fn) from a hook during backward:
    whether the engine runs the node, for autograd.grad with and without
    that node on the way to the inputs; outside backward, the error."""

    def run(use_c):
        (a, b, c), (x, w) = _compiled(use_c)
        gf = a.grad_fn
        asked = []
        other = T.leaf(2)
        loss = a.sum() + other.sum()
        loss.register_hook(lambda g: asked.append(torch._C._will_engine_execute_node(gf)))
        torch.autograd.grad(loss, [x], retain_graph=True)
        torch.autograd.grad(loss, [other], retain_graph=True)
        return asked, T._safe(torch._C._will_engine_execute_node, gf)

    r = both(run)
    assert r[0] == [True, False], r


def test_gradient_edge():
    """A compiled output's GradientEdge as an input of autograd.grad (the
    gradient with respect to that output) and as an output (backward from
    that output with a given gradient)."""

    def run(use_c):
        (a, b, c), (x, w) = _compiled(use_c)
        edge = get_gradient_edge(a)
        loss = (a * 3).sum() + b.sum()
        d_a = torch.autograd.grad(loss, inputs=[edge], retain_graph=True)
        d_x = torch.autograd.grad([edge], [x], grad_outputs=[torch.ones_like(a)])
        return {
            "node_is_grad_fn": edge.node is a.grad_fn,
            "output_nr": edge.output_nr,
            "d_a": _values(d_a),
            "d_x": _values(d_x),
        }

    both(run)


def test_node_api_sweep():
    """torch.autograd.graph.Node's API and the ctx attributes code outside
    the project reads, on a compiled output's grad_fn."""

    def run(use_c):
        (a, b, c), leaves = _compiled(use_c)
        gf = a.grad_fn
        calls = []
        h1 = gf.register_hook(lambda gi, go: calls.append(("post", len(gi), len(go))))
        h2 = gf.register_prehook(lambda go: calls.append(("pre", len(go))))
        rec = {
            "is_node": isinstance(gf, Node),
            "subclass": issubclass(type(gf), Node),
            "name": gf.name(),
            "next_functions": [(type(f).__name__, n) for f, n in gf.next_functions],
            "same_for_every_output": b.grad_fn is gf and c.grad_fn is gf,
            "metadata": dict(gf.metadata),
            "input_metadata": [(tuple(m.shape), str(m.dtype)) for m in gf._input_metadata],
            "requires_grad": T._safe(lambda: gf.requires_grad),
            "needs_input_grad": gf.needs_input_grad,
            "key": T._safe(lambda: gf._compiled_autograd_key()[1:]),
            "dirty_tensors": gf.dirty_tensors,
            "n_saved": len(gf.saved_tensors),
            "n_raw_saved": len(gf._raw_saved_tensors),
            "weakref": weakref.ref(gf)() is gf,
            "handles": (type(h1).__name__, type(h2).__name__),
        }
        gf.user_attribute = "kept"
        rec["user_attribute"] = a.grad_fn.user_attribute
        rec["dict_has_it"] = gf.__dict__.get("user_attribute")
        (a.sum() + b.sum() + c.sum()).backward(retain_graph=True)
        h1.remove()
        h2.remove()
        (a.sum()).backward()
        rec["calls"] = calls
        rec["grads"] = _grads(leaves)
        rec["after_backward"] = T._safe(lambda: gf.saved_tensors)
        return rec

    r = both(run)
    assert r["calls"] == [("pre", 3), ("post", 2, 3)], r["calls"]


def test_raw_saved_tensor_hooks():
    """Hooks registered on a saved tensor through _raw_saved_tensors: packed
    at once, unpacked when the backward reads it."""

    def run(use_c):
        (a, b, c), leaves = _compiled(use_c)
        log = []
        raw = a.grad_fn._raw_saved_tensors
        raw[0].register_hooks(lambda t: (log.append("pack"), t * 1)[1],
                              lambda t: (log.append("unpack"), t)[1])
        err = T._safe(lambda: raw[0].register_hooks(lambda t: t, lambda t: t))
        (a.sum() + b.sum()).backward()
        return log, err, _grads(leaves)

    r = both(run)
    assert r[0] == ["pack", "unpack"], r


def test_module_full_backward_hooks():
    """torch.utils.hooks.BackwardHook (a module's full backward hooks and
    pre-hooks) around a module whose forward calls the compiled function:
    it wraps the outputs, whose grad_fn is the compiled node, and hooks it."""

    class Outer(torch.nn.Module):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, x, w):
            return self.f(x, w)

    def run(use_c):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w = T.leaf(3, 4), T.leaf(3, 4)
        with T.c_runtime(use_c):
            outer = Outer(torch.compile(three, backend="aot_eager"))
            calls = []
            outer.register_full_backward_pre_hook(
                lambda m, go: calls.append(("pre", [g is None for g in go])))
            outer.register_full_backward_hook(
                lambda m, gi, go: calls.append(("post", [g is None for g in gi])))
            a, b, c = outer(x, w)
        T.check_classes((a, b, c), use_c, expect=1)
        (a.sum() + c.sum()).backward()
        return calls, _grads((x, w))

    r = both(run)
    assert [k for k, _ in r[0]] == ["pre", "post"], r
