"""The C CompiledBackward against upstream's CompiledFunction.backward, C
runtime off vs on: backward sequences (retain_graph, twice, double backward,
create_graph), the deterministic-algorithms check, errors raised inside the
backward, and torch.autograd.grad (see test_autograd_function.py for what is
compared).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import differential, leaf

from _autograd_programs import f_many_saved, f_one_of_two, f_plain, f_two, meta_of, randn_grads


# ---------------------------------------------------------------------------
# backward sequences: retain_graph, twice, double backward, create_graph


def retain_then_again(outs, inputs):
    out = outs[0]
    g = torch.randn_like(out)
    out.backward(g, retain_graph=True)
    first = [x.grad.clone() for x in T.leaf_holders(inputs)]
    out.backward(g * 2, retain_graph=True)
    second = [x.grad.clone() for x in T.leaf_holders(inputs)]
    out.backward(g * 3)  # the last one frees
    third = [x.grad.clone() for x in T.leaf_holders(inputs)]
    again = T._safe(out.backward, g)
    saved = T._safe(lambda: out.grad_fn.saved_tensors)
    return first, second, third, again, saved


def test_retain_graph_then_more_backwards():
    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=retain_then_again,
        bw_compiler_factory=T.RecordingBackward,
    )
    # the backward compiler ran once; its function three times per call
    assert on.extra["recorder"].compiles == 1
    assert len(on.extra["recorder"].calls) == 6
    again = on.calls[0]["outputs"]["items"]["backward"]["items"][3]
    assert T.backward_error_type(again) == "RuntimeError", again


def twice(outs, inputs):
    outs[0].sum().backward()
    return outs[0].sum().backward()


def test_backward_twice_without_retain_graph():
    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=twice,
        backward_error="RuntimeError",
    )
    msg = on.calls[0]["outputs"]["items"]["backward"]["items"]["message"]["value"]
    assert "second time" in msg, msg


def double_backward(outs, inputs):
    x = inputs.args[0]
    (gx,) = torch.autograd.grad(outs[0].sum(), x, create_graph=True)
    info = {
        "gx_requires_grad": gx.requires_grad,
        "gx_grad_fn": type(gx.grad_fn).__name__,
        "gx": gx.detach().clone(),
    }
    info["double"] = T._safe(lambda: gx.sum().backward())
    return info


def test_double_backward_error():
    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=double_backward,
        bw_compiler_factory=T.RecordingBackward,
    )
    items = on.calls[0]["outputs"]["items"]["backward"]["items"]
    assert items["gx_requires_grad"]["value"] == "True"
    err = items["double"]["items"]
    assert "does not currently support double backward" in err["message"]["value"], err


def create_graph_grad_output_requires_grad(outs, inputs):
    """create_graph=True with a grad output that requires grad: the double
    backward wrapper, then differentiating w.r.t. the grad output."""
    out = outs[0]
    v = torch.randn_like(out, requires_grad=True)
    gx, gy = torch.autograd.grad(out, inputs.args, grad_outputs=v, create_graph=True)
    res = {"gx": gx.detach().clone(), "rg": gx.requires_grad,
           "fn": type(gx.grad_fn).__name__}
    res["d"] = T._safe(lambda: torch.autograd.grad(gx.sum(), v))
    return res


def test_create_graph_with_grad_output_requiring_grad():
    differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)),
        backward=create_graph_grad_output_requires_grad,
    )


def create_graph_no_grad_inputs(outs, inputs):
    # grad mode on in the backward, but nothing in all_args requires grad
    out = outs[0]
    with torch.enable_grad():
        (gx,) = torch.autograd.grad(out.sum(), inputs.args[0], create_graph=True)
    return gx.requires_grad, type(gx.grad_fn).__name__, gx.detach().clone()


def test_create_graph_plain():
    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=create_graph_no_grad_inputs)


class BwMutation(torch.autograd.Function):
    """Mutates its (saved) input in the backward: an input mutation that
    AOTAutograd keeps in the compiled backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x.mul_(2)
        return g.clone()


def f_bw_mutation(a, b):
    return a * 2, BwMutation.apply(b)


def bw_mutation_backward(create_graph):
    def run(outs, inputs):
        loss = outs[0].sum() + outs[1].sum()
        grads = torch.autograd.grad(loss, inputs.args, create_graph=create_graph)
        return [g.detach().clone() for g in grads], inputs.args[1].detach().clone()

    return run


def _traces_leaf_mutation_in_backward() -> bool:
    """Whether upstream compiles a backward that mutates a leaf input that
    requires grad: 2.11's joint trace raises "a leaf Variable that requires
    grad is being used in an in-place operation" (later releases replay it)."""
    torch._dynamo.reset()
    with D.runtime(False):
        g = aot_function(f_bw_mutation, fw_compiler=nop, bw_compiler=nop)
        try:
            g(leaf(3), torch.ones(3, requires_grad=True))
        except RuntimeError as e:
            if "a leaf Variable that requires grad" not in str(e):
                raise
            return False
    return True


def _bw_mutated_input(kind):
    b = torch.ones(3, requires_grad=True)
    return b * 1 if kind == "non_leaf" else b


@pytest.mark.parametrize("mutated", ["leaf", "non_leaf"])
@pytest.mark.parametrize("create_graph", [False, True])
def test_mutation_in_backward(create_graph, mutated):
    """create_graph=True with an input that requires grad and is mutated in
    the backward: upstream's error; without create_graph the mutation runs.
    A leaf input where upstream cannot compile it (2.11): the same compile
    error on both paths."""
    traces = mutated == "non_leaf" or _traces_leaf_mutation_in_backward()
    off, on = differential(
        f_bw_mutation,
        lambda: (leaf(3), _bw_mutated_input(mutated)),
        backward=bw_mutation_backward(create_graph),
        backward_error="RuntimeError" if create_graph else None,
        expect_error=None if traces else "RuntimeError",
        min_functions=1 if traces else 0,
    )
    if not traces:
        return
    m = meta_of(on)
    assert m.indices_of_inputs_that_requires_grad_with_mutations_in_bw == [1]
    if create_graph:
        msg = on.calls[0]["outputs"]["items"]["backward"]["items"]["message"]["value"]
        assert "input mutations with requires_grad in backward for create_graph=True" in msg


# ---------------------------------------------------------------------------
# the deterministic-algorithms check


def deterministic_backward(outs, inputs):
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return T._safe(lambda: outs[0].sum().backward())
    finally:
        torch.use_deterministic_algorithms(prev)


def test_deterministic_check():
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        off, on = differential(
            f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=deterministic_backward,
            backward_error="RuntimeError",
        )
    finally:
        torch.use_deterministic_algorithms(prev)
    bw = on.calls[0]["outputs"]["items"]["backward"]
    assert T.backward_error_type(bw) == "RuntimeError", bw
    assert "use_deterministic_algorithms(True)" in bw["items"]["message"]["value"]
    assert meta_of(on).deterministic is False


def test_deterministic_compiled_under_true():
    """Compiled with deterministic algorithms on: no check, backward works
    under either setting."""
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        off, on = differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)))
    finally:
        torch.use_deterministic_algorithms(prev)
    assert meta_of(on).deterministic is True


# ---------------------------------------------------------------------------
# errors inside the backward


def backward_then_retry(outs, inputs):
    first = T._safe(lambda: outs[0].sum().backward())
    second = T._safe(lambda: outs[0].sum().backward())
    return first, second, T.grads_of(T.leaf_holders(inputs))


def test_compiled_backward_raises():
    """The compiled backward raises on its first call: the same exception,
    thread state as before, and the graph's saved tensors are gone (a retry
    raises upstream's error). The next forward/backward works."""
    off, on = differential(
        f_plain,
        lambda: (leaf(3, 4), leaf(3, 4)),
        backward=backward_then_retry,
        bw_compiler_factory=lambda: T.RecordingBackward(raise_on={0}),
        calls=2,
    )
    first = on.calls[0]["outputs"]["items"]["backward"]["items"][0]
    assert T.backward_error_type(first) == "ValueError", first
    ok = on.calls[1]["outputs"]["items"]["backward"]["items"][0]
    assert T.backward_error_type(ok) is None, ok


def test_bw_compiler_raises_then_compiles_again():
    """The backward compiler itself fails at the first (lazy) compile: the
    error propagates; the next backward compiles again, in both."""
    off, on = differential(
        f_plain,
        lambda: (leaf(3, 4), leaf(3, 4)),
        backward=backward_then_retry,
        bw_compiler_factory=lambda: T.RecordingBackward(compile_raises=1),
        calls=2,
    )
    assert on.extra["recorder"].compiles == 2
    first = on.calls[0]["outputs"]["items"]["backward"]["items"][0]
    assert T.backward_error_type(first) == "ValueError", first


def test_compiled_backward_wrong_arity():
    """The compiled backward returns the wrong number of grads: autograd's
    own error, the same in both."""

    def compiler(gm, example_inputs):
        def run(args):
            out = gm(*args)
            return list(out)[:-1]

        run._boxed_call = True
        return run

    off, on = differential(
        f_plain,
        lambda: (leaf(3, 4), leaf(3, 4)),
        bw_compiler_factory=lambda: compiler,
        backward_error="RuntimeError",
    )


def test_forward_raises():
    """The compiled forward raises: the same error, state restored."""

    def fw_compiler(gm, example_inputs):
        def run(args):
            raise KeyError("forward failed on purpose")

        run._boxed_call = True
        return run

    off, on = differential(
        f_plain,
        lambda: (leaf(3, 4), leaf(3, 4)),
        compile=lambda fn: aot_function(fn, fw_compiler=fw_compiler, bw_compiler=nop),
        expect_error="KeyError",
        min_functions=1,
    )


# ---------------------------------------------------------------------------
# torch.autograd.grad


def grad_allow_unused(allow_unused, which):
    def run(outs, inputs):
        used = [outs[i] for i in which]
        return torch.autograd.grad(
            sum(o.sum() for o in used), inputs.args, allow_unused=allow_unused
        )

    return run


@pytest.mark.parametrize("allow_unused", [True, False])
@pytest.mark.parametrize(
    "fn,which", [(f_two, [0]), (f_two, [1]), (f_two, [0, 1]), (f_one_of_two, [0])],
    ids=["two_first", "two_second", "two_both", "one_of_two"],
)
def test_autograd_grad_allow_unused(fn, which, allow_unused):
    differential(
        fn,
        lambda: (leaf(3, 4), leaf(3, 4)),
        backward=grad_allow_unused(allow_unused, which),
        bw_compiler_factory=T.RecordingBackward,
        backward_error=None if (allow_unused or fn is not f_one_of_two) else "RuntimeError",
    )


def hooks_backward(outs, inputs):
    """Node hooks (pre and post) on the CompiledFunction node and a tensor
    hook on an output: what they receive, and a hook that changes a grad."""
    seen = []
    gf = outs[0].grad_fn
    gf.register_prehook(lambda grad_outputs: seen.append(
        ("pre", [None if g is None else tuple(g.shape) for g in grad_outputs])))
    gf.register_hook(lambda grad_inputs, grad_outputs: seen.append(
        ("post", [None if g is None else D.TensorValue(g) for g in grad_inputs],
         [None if g is None else tuple(g.shape) for g in grad_outputs])))
    outs[1].register_hook(lambda g: g * 3)
    (outs[0].sum() + outs[1].sum()).backward()
    return seen, T.grads_of(T.leaf_holders(inputs))


def test_autograd_hooks_on_node():
    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=hooks_backward)


def test_backward_inputs_subset():
    """``backward(inputs=[b])``: only b accumulates."""

    def run(outs, inputs):
        (outs[0].sum() + outs[1].sum()).backward(inputs=[inputs.args[1]])
        return T.grads_of(T.leaf_holders(inputs))

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run,
                 bw_compiler_factory=T.RecordingBackward)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed(reentrant):
    """The compiled function under torch.utils.checkpoint: its forward runs
    again inside the backward (recompute)."""
    from torch.utils.checkpoint import checkpoint

    def how(fn):
        inner = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        inner(leaf(3, 4), leaf(3, 4))  # a training graph (reentrant runs under no_grad)

        def outer(a, b):
            return checkpoint(inner, a, b, use_reentrant=reentrant)

        return outer

    differential(f_many_saved, lambda: (leaf(3, 4), leaf(3, 4)), compile=how)


def _user_frames(text: str) -> list[str]:
    """The lines of a traceback outside torch and torch_aot_rt."""
    keep, skipping = [], False
    for line in text.splitlines():
        if line.startswith("  File "):
            skipping = "site-packages/torch/" in line or "torch_aot_rt" in line
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            keep.append(line)
    return keep


def test_anomaly_mode():
    """detect_anomaly: the backward error and the forward traceback recorded
    on the node. The Python frames of upstream's runtime (runtime_wrappers,
    Function.apply) have no C counterpart; the user's frames and the rest of
    the message must be the same."""
    import warnings

    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        rec = T.RecordingBackward(raise_on={0})
        with T.c_runtime(use_c):
            g = aot_function(f_plain, fw_compiler=nop, bw_compiler=rec)
            out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        with torch.autograd.detect_anomaly(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = g(leaf(3, 4), leaf(3, 4))
            tb = out[0].grad_fn.metadata.get("traceback_")
            err = T._safe(lambda: out[0].sum().backward())
        results[use_c] = {
            "error": err,
            "warnings": [(x.category.__name__, _user_frames(str(x.message))) for x in w],
            "traceback": _user_frames("".join(tb)) if tb is not None else None,
            "metadata_keys": sorted(out[0].grad_fn.metadata),
        }
    D.assert_same(results[False], results[True], "anomaly")
    assert results[True]["error"]["type"] == "ValueError"


def test_forward_mode_ad():
    """Dual tensors into the compiled function: _FunctionBase.apply calls
    the class' jvp (not implemented): the same error."""
    import torch.autograd.forward_ad as fwAD

    def how(fn):
        inner = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        inner(leaf(3, 4), leaf(3, 4))

        def outer(a, b):
            with fwAD.dual_level():
                dual = fwAD.make_dual(a, torch.ones_like(a))
                out = inner(dual, b)
                return [fwAD.unpack_dual(o).tangent for o in out]

        return outer

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), compile=how,
                 expect_error="NotImplementedError")


def test_direct_grad_fn_apply():
    """``out.grad_fn.apply(*grads)`` (the non-boxed entry: grads boxed into a
    list by BackwardCFunction.apply)."""

    def run(outs, inputs):
        gf = outs[0].grad_fn
        with torch.no_grad():
            return gf.apply(torch.ones(3, 4), torch.ones(3, 3))

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run)


def test_direct_grad_fn_apply_grad_enabled():
    """The same with grad mode on and no backward running (no ``context`` in
    TLS): the double-backward wrapper without the contextvars hop."""

    def run(outs, inputs):
        gf = outs[0].grad_fn
        res = gf.apply(torch.ones(3, 4), torch.ones(3, 3))
        return [(r.requires_grad, type(r.grad_fn).__name__, r.detach().clone()) for r in res]

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run)


@pytest.mark.parametrize(
    "call",
    ["one_grad", "three_grads", "unboxed", "tuple", "no_grads", "boxed", "unboxed_one"],
)
def test_backward_called_wrongly(call):
    """``CompiledFunction.backward`` called directly with the wrong grads:
    upstream's AssertionErrors (arity, boxed list), the same in C. What is
    wrong depends on the release: 2.13 on take one list of grads, 2.11/2.12
    the grads as arguments."""

    def run(outs, inputs):
        gf = outs[0].grad_fn
        cls = gf._forward_cls
        g = torch.ones(3, 4)
        with torch.no_grad():
            if call == "one_grad":
                return cls.backward(gf, [g])
            if call == "three_grads":
                return cls.backward(gf, [g, g, g])
            if call == "unboxed":
                return cls.backward(gf, g, torch.ones(3, 3))
            if call == "unboxed_one":
                return cls.backward(gf, g)
            if call == "boxed":
                return cls.backward(gf, [g, torch.ones(3, 3)])
            if call == "tuple":
                return cls.backward(gf, (g, torch.ones(3, 3)))
            return cls.backward(gf)

    right = "boxed" if T.BOXED_BACKWARD else "unboxed"
    differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run,
        backward_error=None if call == right else "AssertionError",
    )


def test_contextvars_in_compiled_backward():
    """The compiled backward runs in a copy of the caller's contextvars
    context (``torch._C._get_obj_in_tls('context').run``): it sees the
    caller's values, and what it sets does not leak out. 2.11's backward
    has no such hook: it runs in the caller's context, and what it sets stays."""
    import contextvars

    var = contextvars.ContextVar("torch_aot_rt_test_var", default="unset")

    def compiler(gm, example_inputs):
        def run(args):
            seen.append(var.get())
            var.set("set inside the backward")
            return gm(*args)

        run._boxed_call = True
        return run

    results = {}
    for use_c in (False, True):
        seen: list = []
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_plain, fw_compiler=nop, bw_compiler=compiler)
            out = g(leaf(3, 4), leaf(3, 4))
        T.check_classes(out, use_c, expect=1)
        token = var.set("caller")
        try:
            out[0].sum().backward()
            after = var.get()
        finally:
            var.reset(token)
        results[use_c] = (list(seen), after)
    after = "caller" if T.TLS_CONTEXT else "set inside the backward"
    assert results[False] == results[True] == (["caller"], after), results


def test_class_freed_after_use():
    """The CompiledFunction class, its C forward/backward and the compiled
    function are freed once nothing uses them (the C objects' references
    to the class make cycles the GC must see through), as upstream's."""
    alive = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=nop)
            out = g(leaf(3, 4), leaf(3, 4))
        (cls,) = T.check_classes(out, use_c, expect=1)
        (out[0].sum() + out[1].sum()).backward()
        fwd, bwd = cls.__dict__["forward"].__func__, cls.__dict__["backward"].__func__
        # weak references, not id()s looked up in gc.get_objects(): an id
        # is reused as soon as its object is freed (a flake seen in CI)
        refs = [weakref.ref(o) for o in (cls, cls.compiled_fw, fwd, bwd)]
        del g, out, cls, fwd, bwd
        torch._dynamo.reset()
        gc.collect()
        alive[use_c] = [r() is not None for r in refs]
    assert alive[False] == alive[True], alive
    assert alive[True] == [False, False, False, False], alive


def f_graph_break(a, b):
    y = (a * b).sin()
    torch._dynamo.graph_break()
    z = y.view(-1) * b.view(-1).cos()
    return z, y


def test_graph_break_two_functions():
    """A graph break: two CompiledFunction classes chained in one autograd
    graph (the second's input is the first's output)."""
    off, on = differential(
        f_graph_break,
        lambda: (leaf(3, 4), leaf(3, 4)),
        backward=T.backward_with(randn_grads),
        compile=lambda fn: torch.compile(fn, backend="aot_eager"),
        min_functions=2,
    )
    assert len(on.classes) == 2, on.classes


def test_nested_in_torch_compile():
    """An aot_function-compiled function called inside torch.compile (Dynamo
    graph-breaks around it): the same results and graph breaks."""

    def how(fn):
        inner = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        inner(leaf(3, 4), leaf(3, 4))  # compiled outside Dynamo first

        def outer(a, b):
            o = inner(a * 2, b)
            return o[0].sum() + o[1].sum(), o[1]

        return torch.compile(outer, backend="aot_eager")

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), compile=how, min_functions=2)
