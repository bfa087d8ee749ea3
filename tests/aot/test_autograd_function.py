"""AOTAutograd's CompiledFunction with the C forward/backward
(``torch_aot_rt._C.CompiledForward`` / ``CompiledBackward`` / ``FunctionApply``),
C runtime off vs on, in one process.

Every "on" run checks that ``stats()["autograd_functions"]`` grew, that nothing
fell back to upstream, and that the CompiledFunction classes behind the outputs
really have the C forward and backward (and the "off" run that they do not).

Compared per call (``_training.differential``): outputs (values, strides,
``requires_grad``, ``grad_fn`` type, ``is_leaf``, ``_base`` and storage
sharing, version counters), inputs after the call, the autograd ``ctx`` of each
CompiledFunction node (its attributes, saved tensors, symints, opaque objects,
compiled-autograd key, non-differentiable marks), the gradients after a
backward with given grad outputs (or the backward's exception), the thread
state, warnings, and what the compiled backward itself received (values,
strides, ``None``s) and how often it was compiled.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import aot_function, nop

import _differential as D
import torch_aot_rt
import _training as T
from _training import differential, leaf, nonleaf


def meta_of(on) -> object:
    assert on.classes, "no CompiledFunction class seen"
    return on.classes[0].metadata


def randn_grads(outs):
    return [torch.randn_like(o) for o in outs]


# ---------------------------------------------------------------------------
# programs: each reaches one part of CompiledFunction.forward / backward


def f_plain(a, b):
    return a * b + 1, (a @ b.t()).sin()


def f_non_diff(a, b, c):
    # c does not require grad; outputs 1, 2, 3 do not require grad
    return a * 2, c * 3, a.detach() + 1, (a * b).argmax(), b * a


def f_alias_input(a):
    return a.view(-1), a * 2, a[0], a, a.t()


def f_alias_intermediate(a):
    y = a * 2
    return y.view(-1), y.t(), y


def f_intermediate_bases(a, b):
    y = a * 2
    z = b + 1
    return y[0], z.t(), y[1], z.view(-1)


def f_unsafe_view(a, b):
    return (a @ b).view(-1), (a * 2).split(2)


def f_metadata_mutation(a):
    a.t_()
    return a * 2


def f_metadata_mutation_alias(a):
    a.unsqueeze_(0)
    return a[0], a * 2


def f_metadata_mutation_return_input(a):
    a.unsqueeze_(0)
    return a, a * 2


def f_metadata_mutation_transpose_alias(a):
    # upstream's alias replay cannot regenerate a[0] here: an error
    a.transpose_(0, 1)
    return a[0], a * 2


def f_data_mutation(a):
    a.mul_(2)
    return a + 1


def f_buffer_mutation(w, b):
    b.add_(1)
    return w * b, (w * 2).sum()


def f_batch_norm(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)


def f_conv(x, w):
    return F.conv2d(x, w, padding=1).relu()


def f_matmul(a, b):
    return a @ b


def f_two(a, b):
    return a * 2, b * 3


def f_one_of_two(a, b):
    return a.sin() * 2


def f_mutation_and_alias(a):
    a.mul_(2)
    return a.view(-1), a * 3


def f_many_saved(a, b):
    y = a.sin() * b.cos()
    z = (y @ b.t()).tanh()
    return z.exp(), y


def f_many_inputs(*args):
    # more arguments than FunctionApply keeps on its stack
    acc = args[0] * 1
    for i, a in enumerate(args[1:]):
        acc = acc + a * (i + 2) if i % 2 else acc * a.sigmoid()
    return acc, args[3].view(-1), args[5] * 0


CASES = {
    # name: (fn, inputs factory, backward, check on the metadata)
    "plain": (
        f_plain,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: output_types_are(m, ["non_alias", "non_alias"]),
    ),
    "non_differentiable_outputs": (
        f_non_diff,
        lambda: (leaf(3, 4), leaf(3, 4), leaf(3, 4, requires_grad=False)),
        T.backward_with(randn_grads, only=[0]),
        lambda m: [o.requires_grad for o in m.output_info] == [True, False, False, False, True],
    ),
    "non_differentiable_outputs_all_used": (
        f_non_diff,
        lambda: (leaf(3, 4), leaf(3, 4), leaf(3, 4, requires_grad=False)),
        T.default_backward,
        lambda m: [o.requires_grad for o in m.output_info] == [True, False, False, False, True],
    ),
    "alias_of_input": (
        f_alias_input,
        lambda: (leaf(3, 4),),
        T.default_backward,
        lambda m: {"alias_of_input", "is_input"} <= set(types(m)),
    ),
    "alias_of_intermediate": (
        f_alias_intermediate,
        lambda: (leaf(3, 4),),
        T.backward_with(randn_grads),
        lambda m: any(t.startswith("alias_of_intermediate") for t in types(m)),
    ),
    "intermediate_bases": (
        f_intermediate_bases,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: m.num_intermediate_bases > 0,
    ),
    "unsafe_view": (
        f_unsafe_view,
        lambda: (leaf(4, 4), leaf(4, 5)),
        T.backward_with(randn_grads),
        lambda m: types(m).count("unsafe_view_alias") == 3 and m.num_unsafe_view_outputs == 3,
    ),
    "metadata_mutation_requires_grad": (
        f_metadata_mutation,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(False, True, True)],
    ),
    "metadata_mutation_then_alias": (
        f_metadata_mutation_alias,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(False, True, True)],
    ),
    "metadata_mutation_return_input": (
        f_metadata_mutation_return_input,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(False, True, True)] and "is_input" in types(m),
    ),
    "data_mutation_requires_grad": (
        f_data_mutation,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(True, False, True)],
    ),
    "buffer_mutation_no_grad": (
        f_buffer_mutation,
        lambda: (leaf(3), torch.zeros(3)),
        T.default_backward,
        lambda m: mutations(m) == [(True, False, False)],
    ),
    "batch_norm_running_stats": (
        f_batch_norm,
        lambda: (leaf(4, 3, 2, 2), leaf(3), leaf(3), torch.zeros(3), torch.ones(3)),
        T.backward_with(randn_grads),
        lambda m: len(m.mutated_inp_runtime_indices) == 2,
    ),
    "duplicate_inputs": (
        f_plain,
        lambda: (lambda x: (x, x))(leaf(3, 4)),
        T.backward_with(randn_grads),
        # the same tensor twice (aot_function passes both through)
        lambda m: len(m.input_info) == 2,
    ),
    "data_mutation_and_alias": (
        f_mutation_and_alias,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(True, False, True)] and "alias_of_input" in types(m),
    ),
    "unused_input_requires_grad": (
        f_one_of_two,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: len(m.input_info) == 2,
    ),
    "many_inputs": (
        f_many_inputs,
        lambda: tuple(leaf(2, 3, requires_grad=i % 3 != 1) for i in range(20)),
        T.backward_with(randn_grads),
        lambda m: len(m.input_info) == 20,
    ),
    "many_saved": (
        f_many_saved,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: m.num_outputs == 2,
    ),
}


def types(m):
    return [o.output_type.name for o in m.output_info]


def output_types_are(m, expected):
    return types(m) == expected



def mutations(m):
    return [
        (m.input_info[i].mutates_data, m.input_info[i].mutates_metadata,
         m.input_info[i].requires_grad)
        for i in m.mutated_inp_runtime_indices
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_program(case):
    fn, make_inputs, backward, check = CASES[case]
    off, on = differential(
        fn, make_inputs, backward=backward, bw_compiler_factory=T.RecordingBackward, calls=2
    )
    m = meta_of(on)
    assert check(m), (types(m), mutations(m), m)
    # the compiled backward really ran, once per call, in both
    assert len(on.extra["recorder"].calls) == 2


def test_metadata_mutation_of_leaf_requiring_grad():
    """AOTAutograd does not allow it (as eager): the same error at compile."""
    differential(f_metadata_mutation, lambda: (leaf(3, 4),), expect_error="RuntimeError",
                 min_functions=0)


def test_metadata_mutation_alias_replay_error():
    """Upstream's alias replay fails on this one: the same error with C."""
    differential(
        f_metadata_mutation_transpose_alias,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        expect_error="RuntimeError",
    )


@pytest.mark.parametrize("case", ["plain", "alias_of_input", "data_mutation_requires_grad",
                                  "buffer_mutation_no_grad", "non_differentiable_outputs"])
def test_training_graph_called_without_grad(case):
    """A training graph (compiled on the first call, with grad) called again
    under no_grad and inference_mode, then with grad again."""
    fn, make_inputs, backward, _ = CASES[case]

    def maybe_backward(outs, inputs):
        if any(o.requires_grad for o in D._flat_tensors(outs)):
            return backward(outs, inputs)
        return "no backward"

    differential(
        fn, make_inputs, backward=maybe_backward, calls=4,
        ctx=[None, torch.no_grad, torch.inference_mode, None],
    )


# ---------------------------------------------------------------------------
# tangents: memory-format coercion of the grad outputs


def noncontig_grads(outs):
    # the same shape, transposed strides
    return [torch.randn(tuple(reversed(o.shape))).t() if o.dim() == 2 else
            torch.randn_like(o) for o in outs]


def expanded_grads(outs):
    return [torch.randn(1, *o.shape[1:]).expand(o.shape) for o in outs]


def contiguous_grads_for_channels_last(outs):
    return [torch.randn(o.shape) for o in outs]


def scalar_grads(outs):
    return [torch.tensor(1.5).expand(o.shape) for o in outs]


TANGENT_CASES = {
    "transposed": (f_matmul, lambda: (leaf(3, 4), leaf(4, 5)), noncontig_grads),
    "expanded": (f_matmul, lambda: (leaf(3, 4), leaf(4, 5)), expanded_grads),
    "expanded_scalar": (f_matmul, lambda: (leaf(3, 4), leaf(4, 5)), scalar_grads),
    "channels_last_output_contiguous_grad": (
        f_conv,
        lambda: (
            torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last).requires_grad_(),
            leaf(4, 3, 3, 3),
        ),
        contiguous_grads_for_channels_last,
    ),
    "channels_last_grad_contiguous_output": (
        f_conv,
        lambda: (leaf(2, 3, 5, 5), leaf(4, 3, 3, 3)),
        lambda outs: [torch.randn(o.shape).to(memory_format=torch.channels_last) for o in outs],
    ),
    "output_expanded": (
        lambda a: (a * 2).expand(3, 4),
        lambda: (leaf(1, 4),),
        noncontig_grads,
    ),
}


@pytest.mark.parametrize("guess_strides", [True, False])
@pytest.mark.parametrize("case", sorted(TANGENT_CASES))
def test_tangent_layouts(case, guess_strides):
    """Grad outputs with other strides than the forward outputs: the compiled
    backward must see the same (coerced) tangents, values and strides. With
    ``guess_tangent_strides_as_outputs`` off, tangents are coerced to a memory
    format instead of exact strides."""
    fn, make_inputs, grads = TANGENT_CASES[case]
    # 2.12's MemoryFormatMeta.from_tensor keeps an expanded output's
    # overlapping strides for its tangent (2.13 takes its memory format):
    # the coercion's copy into them raises, upstream and C alike
    upstream_raises = case == "output_expanded" and guess_strides and T.RELEASE_SERIES < (2, 13)
    off, on = differential(
        fn,
        make_inputs,
        backward=T.backward_with(grads),
        bw_compiler_factory=T.RecordingBackward,
        config=lambda: torch._functorch.config.patch(
            guess_tangent_strides_as_outputs=guess_strides
        ),
        backward_error="RuntimeError" if upstream_raises else None,
    )
    if upstream_raises:
        return
    # the tangent the compiled backward got has the layout of the output it
    # belongs to (exact strides, or its memory format), not the one passed
    rec = on.extra["recorder"].calls[0]
    assert rec, "compiled backward got no args"
    if case != "output_expanded":
        out = on.calls[0]["outputs"]["items"]["outs"]
        out = out["items"][0] if "items" in out else out
        assert rec[-1]["shape"] == out["shape"], (rec[-1], out)
        assert rec[-1]["stride"] == out["stride"], (rec[-1]["stride"], out["stride"])


def test_tangent_of_another_type():
    """A grad output of a Tensor subclass (an nn.Parameter) where a plain
    tensor was traced: upstream's process_runtime_tangent raises; the C
    path hands such tangents to it."""
    differential(
        f_matmul,
        lambda: (leaf(3, 4), leaf(4, 5)),
        backward=T.backward_with(
            lambda outs: [torch.nn.Parameter(torch.randn(3, 5), requires_grad=False)]
        ),
        backward_error="RuntimeError",
    )


def test_tangent_coercion_happens():
    """The coercion is not a no-op in these cases: the strides the compiled
    backward receives differ from the grad outputs given (both runs)."""
    seen = {}
    for use_c in (False, True):
        rec = T.RecordingBackward()
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_matmul, fw_compiler=nop, bw_compiler=rec)
            a, b = leaf(3, 4), leaf(4, 5)
            out = g(a, b)
        grad = torch.randn(5, 3).t()
        out.backward(grad)
        tangent = rec.calls[0][-1]
        seen[use_c] = tangent["stride"]
        assert grad.stride() == (1, 3)
    assert seen[False] == seen[True] == (5, 1), seen


@pytest.mark.parametrize("guess_strides", [True, False])
def test_tangent_coercion_in_c(guess_strides):
    """The C backward coerces plain-tensor tangents itself: upstream's
    coerce_to_expected_memory_format (Python) runs on every such backward
    with the C path off, never with it on (counted as Python frames, however
    the function is reached), and the tangent the compiled backward receives
    is the same (strides, values, requires_grad)."""
    seen = {}
    for use_c in (False, True):
        rec = T.RecordingBackward()
        torch._dynamo.reset()
        with torch._functorch.config.patch(guess_tangent_strides_as_outputs=guess_strides):
            with T.c_runtime(use_c):
                g = aot_function(f_matmul, fw_compiler=nop, bw_compiler=rec)
                out = g(leaf(3, 4), leaf(4, 5))
            loss = out.sum()
            loss.backward(retain_graph=True)  # compiles the backward
            frames = []

            def profile(frame, event, arg):
                if event == "call" and frame.f_code.co_name == "coerce_to_expected_memory_format":
                    frames.append(frame.f_code.co_filename)

            sys.setprofile(profile)
            try:
                loss.backward()  # a stride-0 tangent: coerced
            finally:
                sys.setprofile(None)
        seen[use_c] = (rec.calls[-1][-1], len(frames))
    assert seen[False][1] >= 1, "upstream did not coerce: the test proves nothing"
    D.assert_same(seen[False][0], seen[True][0])
    if D.C_ENABLED:
        assert seen[True][1] == 0, seen


def test_tangent_coercion_under_dispatch_mode():
    """The restrided copy goes through the same torch callables as upstream's
    (``torch.empty_strided`` with the same keywords, ``Tensor.copy_``), so a
    TorchDispatchMode active during the backward sees the same ops, in the
    same order, with the same arguments."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self.calls.append(
                (str(func), [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args],
                 sorted(kwargs.items(), key=lambda kv: kv[0]))
            )
            return func(*args, **kwargs)

    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        # the stride guess (the default from 2.12; 2.11 guesses the memory format)
        with T.c_runtime(use_c), torch._functorch.config.patch(
            guess_tangent_strides_as_outputs=True
        ):
            g = aot_function(f_matmul, fw_compiler=nop, bw_compiler=nop)
            out = g(leaf(3, 4), leaf(4, 5))
        loss = out.sum()
        mode = Record()
        with mode:
            loss.backward()
        seen[use_c] = [c for c in mode.calls if "empty_strided" in c[0] or "copy_" in c[0]]
    assert seen[False], "upstream made no restriding call the mode could see"
    assert seen[False] == seen[True], seen


# ---------------------------------------------------------------------------
# symints: dynamic shapes through torch.compile


def f_dynamic(x, w):
    n = x.shape[0]
    y = (x * w).sum(1) * n
    return y, n, x.view(n, -1)[:, :1] * 2


def test_dynamic_symint_outputs_and_saved_symints():
    inputs = [lambda: (leaf(4, 3), leaf(3)), lambda: (leaf(6, 3), leaf(3))]
    off, on = differential(
        f_dynamic,
        lambda: inputs[D.call_index() % 2](),
        backward=T.backward_with(randn_grads),
        bw_compiler_factory=T.RecordingBackward,
        compile="dynamo",
        compile_kwargs={"dynamic": True},
        calls=3,
    )
    m = meta_of(on)
    assert any(o.raw_type is int or "Sym" in o.raw_type.__name__ for o in m.output_info), [
        o.raw_type for o in m.output_info
    ]
    # symints saved for backward end up on ctx.symints
    n_symints = sum(1 for _ in range(*m.symints_saved_for_backwards_slice.indices(10**6)))
    assert n_symints > 0, m.symints_saved_for_backwards_slice
    ctx = on.calls[0]["outputs"]["items"]["ctx"]["items"][0]["items"]
    assert ctx["symints"]["container"] == "list" and ctx["symints"]["items"], ctx
    # saved tensors with dynamic dims are marked for compiled autograd
    assert m.dynamic_saved_tensors_idxs, m.dynamic_saved_tensors_idxs
    dims = ctx["saved_dynamic_dims"]["items"]
    assert any(d.get("container") == "list" for d in dims), dims


# ---------------------------------------------------------------------------
# tensors saved without the version-counter check (stashed on ctx)


class Stash(torch.autograd.Function):
    """Stashes tensors on ctx directly (not save_for_backward): traced by
    Dynamo, AOTAutograd saves them without the version-counter check."""

    @staticmethod
    def forward(ctx, x):
        y = x @ x.t()
        ctx.y = y
        ctx.x = x
        return y * 2

    @staticmethod
    def backward(ctx, g):
        return (g + g.t()) @ ctx.x * 2 + ctx.y.sum()


def f_stash(x, w):
    return Stash.apply(x * w) + 1, x * 3


def mutate_saved_then_backward(which):
    def run(outs, inputs):
        gf = outs[0].grad_fn
        with torch.no_grad():
            if which == "no_vc":
                gf._tensors_no_vc_check[0].mul_(2)
            elif which == "input":
                inputs.args[0].mul_(1)  # a saved input: the version check fires
        (outs[0].sum() + outs[1].sum()).backward()
        return T.grads_of(T.leaf_holders(inputs))

    return run


@pytest.mark.parametrize("which", ["none", "no_vc", "input"])
def test_saved_without_version_check(which):
    off, on = differential(
        f_stash,
        lambda: (leaf(3, 3), leaf(3, 3)),
        backward=mutate_saved_then_backward(which),
        bw_compiler_factory=T.RecordingBackward,
        compile="dynamo",
        backward_error="RuntimeError" if which == "input" else None,
    )
    m = meta_of(on)
    assert m.num_tensors_saved_with_no_vc_check > 0, m.num_tensors_saved_with_no_vc_check
    ctx = on.calls[0]["outputs"]["items"]["ctx"]["items"][0]["items"]
    assert ctx["n_no_vc"]["value"] != "0", ctx


# ---------------------------------------------------------------------------
# thread state seen by the compiled backward: autocast, saved-tensor hooks


def test_autocast_backward():
    """Compiled under autocast (disable_amp): the compiled backward runs with
    autocast off, also when the backward is called under autocast."""

    def run(outs, inputs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs[0].float().sum().backward()
        return T.grads_of(T.leaf_holders(inputs))

    def config():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run,
        bw_compiler_factory=T.RecordingBackward, config=config,
    )
    tls = on.extra["recorder"].tls
    assert tls and not tls[0]["autocast_cpu"], tls


def test_saved_tensor_hooks_pack_unpack():
    """Python saved-tensor hooks around the forward see what
    ctx.save_for_backward saved (not the tensors stashed without the version
    check), and unpack them in the backward: the same calls in both."""
    results = {}
    for use_c in (False, True):
        log = []

        def pack(t):
            log.append(("pack", tuple(t.shape)))
            return t

        def unpack(t):
            log.append(("unpack", tuple(t.shape)))
            return t

        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w = leaf(3, 3), leaf(3, 3)
        with T.c_runtime(use_c):
            cf = torch.compile(f_stash, backend="aot_eager", fullgraph=True)
            cf(leaf(3, 3), leaf(3, 3))  # compile outside the hooks
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                out = cf(x, w)
        T.check_classes(out, use_c, expect=1)
        (out[0].sum() + out[1].sum()).backward()
        results[use_c] = (log, D.TensorValue(x.grad), D.TensorValue(w.grad))
    D.assert_same(results[False], results[True])
    assert any(e[0] == "unpack" for e in results[True][0]), results[True][0]


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


# ---------------------------------------------------------------------------
# the lazy backward compile and the class


def test_lazy_backward_compile():
    """The backward is compiled once, at the first backward, in both; and
    ``CompiledFunction.compiled_bw`` goes from None to the compiled function."""
    seen = {}
    for use_c in (False, True):
        rec = T.RecordingBackward()
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_plain, fw_compiler=nop, bw_compiler=rec)
            out = g(leaf(3, 4), leaf(3, 4))
        (cls,) = T.check_classes(out, use_c, expect=1)
        log = [rec.compiles, cls.compiled_bw]
        out[0].sum().backward()
        log += [rec.compiles, cls.compiled_bw]
        out2 = g(leaf(3, 4), leaf(3, 4))
        (out2[1].sum() + out2[0].sum()).backward()
        log += [rec.compiles, len(rec.calls), cls.compiled_bw is log[3]]
        assert log[1] is None and log[3] is not None, log
        seen[use_c] = [log[0], log[2], log[4], log[5], log[6],
                       getattr(log[3], "_boxed_call", None), type(log[3]).__name__]
    assert seen[False] == seen[True], seen
    assert seen[True][:4] == [0, 1, 1, 2], seen


def donated_then_retain(outs, inputs):
    if D.call_index() == 0:
        outs[0].sum().backward()
    else:
        outs[0].sum().backward(retain_graph=True)
    return T.grads_of(T.leaf_holders(inputs))


def test_donated_buffers_then_retain_graph():
    """The backward was compiled (lazily) for a backward without retain_graph,
    with donated buffers; a later retain_graph backward of the same graph is
    upstream's error, in both."""
    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=donated_then_retain,
        bw_compiler_factory=T.RecordingBackward,
    )
    assert meta_of(on).bw_donated_idxs != []
    second = on.calls[1]["outputs"]["items"]["backward"]
    assert T.backward_error_type(second) == "RuntimeError", second
    assert "donated buffers" in second["items"]["message"]["value"]


@pytest.mark.parametrize("donated", [True, False])
def test_donated_buffer_config(donated):
    """functorch config.donated_buffer off: retain_graph after a plain
    backward works."""
    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=donated_then_retain,
        config=lambda: torch._functorch.config.patch(donated_buffer=donated),
    )
    second = on.calls[1]["outputs"]["items"]["backward"]
    assert (T.backward_error_type(second) == "RuntimeError") == donated, second


def test_lazy_backward_compile_under_retain_graph():
    """The first backward is a retain_graph one (saved_tensors_use_once is
    False in the lazy compile: no donated buffers)."""

    def run(outs, inputs):
        outs[0].sum().backward(retain_graph=True)
        outs[0].sum().backward()
        return T.grads_of(T.leaf_holders(inputs))

    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run,
        bw_compiler_factory=T.RecordingBackward,
    )
    assert meta_of(on).bw_donated_idxs == []


def class_summary(cls) -> dict:
    d = cls.__dict__
    return {
        "attrs": sorted(k for k in d if k not in ("forward", "backward")),
        "forward_kind": type(d["forward"]).__name__,
        "backward_kind": type(d["backward"]).__name__,
        "aot_id": type(cls._aot_id).__name__,
        "metadata": type(cls.metadata).__name__,
        "lazy": type(cls._lazy_backward_info).__name__,
        "compiled_fw": callable(cls.compiled_fw),
        "compiled_bw": cls.compiled_bw,
        # 2.11/2.12: no boxed_grads_call (unboxed backward)
        "boxed_grads_call": getattr(cls, "boxed_grads_call", None),
        "num_symints_saved_for_bw": cls.num_symints_saved_for_bw,
        "maybe_subclass_metadata": cls.maybe_subclass_metadata,
        "bases": [b.__name__ for b in cls.__mro__],
        "backward_cls": cls._backward_cls.__name__,
        # 2.11/2.12 keep the subclass unwrap/wrap functions instead
        "has_bw_prologue": callable(getattr(cls, "_bw_prologue_fn", None)),
        "has_bw_epilogue": callable(getattr(cls, "_bw_epilogue_fn", None)),
        "vjp_is_backward": cls.vjp is cls.backward,
        "setup_context": "setup_context" in d,
    }


def test_class_attributes():
    """Upstream's class keeps every attribute compiled autograd and the
    cache read; only forward/backward are ours (staticmethods)."""
    summaries = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=nop)
            out = g(leaf(3, 4), leaf(3, 4))
        (cls,) = T.check_classes(out, use_c, expect=1)
        s = class_summary(cls)
        out[0].sum().backward()
        after = class_summary(cls)
        assert s["compiled_bw"] is None and after["compiled_bw"] is not None
        s["compiled_bw_after"] = (type(after["compiled_bw"]).__name__,
                                  getattr(after["compiled_bw"], "_boxed_call", None))
        s["compiled_bw"] = None
        s["metadata_is_fw_metadata"] = cls.metadata is cls._lazy_backward_info.saved_context.fw_metadata \
            if cls._lazy_backward_info.saved_context is not None else None
        summaries[use_c] = s
    D.assert_same(summaries[False], summaries[True], "class")
    assert summaries[True]["forward_kind"] == "staticmethod"


def _introspect(cls, aspect, ctx):
    fwd, bwd = cls.forward, cls.backward
    if aspect == "names":
        return [(getattr(f, "__name__", None), getattr(f, "__qualname__", None))
                for f in (fwd, bwd)]
    if aspect == "signature":
        import inspect

        return [str(T._safe(inspect.signature, f)) for f in (fwd, bwd)]
    if aspect == "weakref":
        return [T._safe(lambda f=f: weakref.ref(f)() is f) for f in (fwd, bwd)]
    if aspect == "wrong_calls":
        return [
            T._safe(lambda: cls.forward()),
            T._safe(lambda: cls.backward()),
            T._safe(lambda: cls.backward(ctx, grads=[])),
        ]
    raise AssertionError(aspect)


@pytest.mark.parametrize("aspect", ["names", "signature", "weakref", "wrong_calls"])
def test_forward_backward_introspection(aspect):
    """``CompiledFunction.forward``/``backward`` as Python code sees them:
    names, signature, weak references, and the TypeError of a call without
    ctx. (Nothing in torch 2.13's own paths reads these for CompiledFunction;
    user code and tools can.)"""
    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_plain, fw_compiler=nop, bw_compiler=nop)
            out = g(leaf(3, 4), leaf(3, 4))
        (cls,) = T.check_classes(out, use_c, expect=1)
        seen[use_c] = _introspect(cls, aspect, out[0].grad_fn)
    D.assert_same(seen[False], seen[True], aspect)


def test_compiled_autograd_key():
    """The key compiled autograd reads from a CompiledFunction node
    (``ctx._compiled_autograd_key()``: the backward class's id and the saved
    symints), on the C++ node as on upstream's, with compiled autograd
    enabled around the forward."""
    from torch._dynamo import compiled_autograd

    keys = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        before = T.node_stats()
        with T.c_runtime(use_c):
            g = torch.compile(f_dynamic, backend="aot_eager", dynamic=True, fullgraph=True)
            with compiled_autograd._enable(torch.compile(backend="eager")):
                out = g(leaf(5, 3), leaf(3))
        if use_c and T.cpp_node_in_use():
            assert T.node_stats_delta(before) == {"taken": 1}
        (cls,) = T.check_classes(out, use_c, expect=1)
        gf = out[0].grad_fn
        key = cls._compiled_autograd_key(gf)
        assert isinstance(key, tuple) and all(type(k) is int for k in key), key
        assert gf._compiled_autograd_key() == key
        assert key[0] == type(gf)._autograd_function_id if not use_c or not T.cpp_node_in_use() \
            else key[0] == cls._backward_cls._autograd_function_id
        keys[use_c] = (len(key), key[1:])
        out[0].sum().backward()
    assert keys[False] == keys[True], keys
    assert keys[True][0] > 1  # the function id and the saved symints


# ---------------------------------------------------------------------------
# memory: what the backward releases, and when


class BackwardSpy:
    """Wraps ``cls.backward`` (C or upstream's) to keep the grads list the
    engine passed, to check it was emptied."""

    def __init__(self, cls):
        self.lists: list = []
        inner = cls.__dict__["backward"].__func__
        spy = self

        def backward(ctx, *args):
            spy.lists.append(args[0] if len(args) == 1 else args)
            return inner(ctx, *args)

        cls.backward = staticmethod(backward)


def test_saved_tensors_and_grads_released():
    """After a backward without retain_graph: ``ctx.saved_tensors`` raises
    upstream's error, the tensors the compiled backward got (saved
    intermediates, tangents) are dead, the grads list was emptied; the same
    in both runs."""
    results = {}
    for use_c in (False, True):
        rec = T.RecordingBackward()
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=rec)
            a, b = leaf(3, 4), leaf(3, 4)
            out = g(a, b)
        (cls,) = T.check_classes(out, use_c, expect=1)
        spy = BackwardSpy(cls)
        gf = out[0].grad_fn
        n_saved = len(gf.saved_tensors)
        assert n_saved > 0
        torch.autograd.backward(out, [torch.randn(3, 3), torch.randn(3, 4)])
        gc.collect()
        err = T._safe(lambda: gf.saved_tensors)
        # the saved inputs themselves stay alive (the test holds them)
        alive = [
            w is not None and w() is not None
            and not any(w().untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                        for t in (a, b))
            for w in rec.weak[0]
        ]
        results[use_c] = {
            "saved_error": err,
            "alive": alive,
            "grads_lists": [list(x) if isinstance(x, list) else ("not a list", len(x))
                            for x in spy.lists],
            "n_args": len(rec.weak[0]),
        }
        # 2.13 on: the boxed grads list is emptied; 2.11/2.12: the grads
        # arrive as arguments (a tuple, left as it was)
        assert results[use_c]["grads_lists"] == (
            [[]] if T.BOXED_BACKWARD else [("not a list", 2)]), results[use_c]
        if T.BOXED_BACKWARD:
            # 2.11/2.12's upstream (unboxed) leaves some of them alive: there
            # the comparison below requires the C path to leave the same ones
            assert not any(alive), alive
        assert isinstance(err, dict) and err["type"] == "RuntimeError", err
    D.assert_same(results[False], results[True], "released")


def test_saved_tensors_die_inside_compiled_backward():
    """Inside the compiled backward, its argument list is the only owner of
    the saved tensors and tangents (upstream clears ctx's saved tensors and
    the grads list first): dropping the list frees them there and then. The
    reference counts the compiled backward sees are the same in both."""
    results = {}
    for use_c in (False, True):
        inner_alive = []

        def compiler(gm, example_inputs):
            def run(args):
                # not the inputs and outputs, which the test holds
                refs = [weakref.ref(a) for a in args if isinstance(a, torch.Tensor)
                        and not any(a.untyped_storage().data_ptr()
                                    == t.untyped_storage().data_ptr() for t in held)]
                counts = [sys.getrefcount(a) for a in args]
                mine = list(args)
                args.clear()
                res = gm(*mine)
                del mine
                gc.collect()
                inner_alive.append(([r() is not None for r in refs], counts))
                return res

            run._boxed_call = True
            return run

        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=compiler)
            a, b = leaf(3, 4), leaf(3, 4)
            out = g(a, b)
        held = (a, b, *out)
        T.check_classes(out, use_c, expect=1)
        # grads made by the engine (nobody else holds them)
        (out[0].sum() * 2 + out[1].sum()).backward()
        results[use_c] = (inner_alive, a.grad.clone(), b.grad.clone())
    D.assert_same(results[False][0], results[True][0], "inside_backward")
    assert not any(results[True][0][0][0]), results[True][0]


def test_refcounts_in_compiled_backward_recorder():
    """The same, through the recorder and a differential run with several
    program shapes (aliases, mutations, non-differentiable outputs)."""
    for case in ("plain", "alias_of_intermediate", "data_mutation_requires_grad",
                 "non_differentiable_outputs"):
        fn, make_inputs, backward, _ = CASES[case]
        differential(
            fn, make_inputs, backward=backward,
            bw_compiler_factory=lambda: T.RecordingBackward(refcounts=True),
        )


# ---------------------------------------------------------------------------
# reference leaks and threads


def _step(g, x, w):
    out = g(x, w)
    torch.autograd.backward(out, [torch.ones(3, 3), torch.ones(3, 4)])


@pytest.mark.parametrize("use_c", [False, True])
def test_no_reference_leaks(use_c):
    torch._dynamo.reset()
    with T.c_runtime(use_c):
        g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=nop)
        x, w = leaf(3, 4), leaf(3, 4)
        out = g(x, w)
    (cls,) = T.check_classes(out, use_c, expect=1)
    del out
    for _ in range(20):
        _step(g, x, w)
    gc.collect()
    objs = {"x": x, "w": w, "cls": cls, "g": g, "None": None, "True": True, "False": False,
            "metadata": cls.metadata, "compiled_fw": cls.compiled_fw,
            "compiled_bw": cls.compiled_bw}
    before = {k: sys.getrefcount(v) for k, v in objs.items()}
    fwd, bwd = cls.__dict__["forward"].__func__, cls.__dict__["backward"].__func__
    fb = (sys.getrefcount(fwd), sys.getrefcount(bwd))
    n_objs = len(gc.get_objects())
    for _ in range(500):
        _step(g, x, w)
    gc.collect()
    after = {k: sys.getrefcount(v) for k, v in objs.items()}
    # None/True/False move with unrelated interpreter activity: a leak of one
    # per step would show as >= 500
    for k in ("None", "True", "False"):
        # these move with unrelated interpreter activity (caches): not a check
        before.pop(k), after.pop(k)
    assert before == after
    assert (sys.getrefcount(fwd), sys.getrefcount(bwd)) == fb
    assert len(gc.get_objects()) - n_objs < 100


def test_no_leaks_on_error_paths():
    """A backward that raises, 300 times: no growth."""
    torch._dynamo.reset()
    rec = T.RecordingBackward(raise_on=set(range(10**6)))
    with T.c_runtime(True):
        g = aot_function(f_plain, fw_compiler=nop, bw_compiler=rec)
        x, w = leaf(3, 4), leaf(3, 4)
        out = g(x, w)
    T.check_classes(out, True, expect=1)
    del out

    def step():
        out = g(x, w)
        try:
            out[0].sum().backward()
        except ValueError:
            pass
        # the recorder's own records (from 3.14 CPython tracks every dict,
        # the thread-state records' included)
        rec.calls.clear()
        rec.weak.clear()
        rec.tls.clear()

    for _ in range(20):
        step()
    gc.collect()
    before = (sys.getrefcount(x), sys.getrefcount(w), len(gc.get_objects()))
    for _ in range(300):
        step()
    gc.collect()
    after = (sys.getrefcount(x), sys.getrefcount(w), len(gc.get_objects()))
    assert before[:2] == after[:2]
    assert after[2] - before[2] < 100, (before, after)


def test_threads():
    """4 threads x 100 forward/backward steps on their own inputs through one
    compiled function (C on), the first backward of all racing the lazy
    backward compile: the same grads as a single-threaded run."""
    torch._dynamo.reset()
    rec = T.RecordingBackward()
    with T.c_runtime(True):
        g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=rec)
        warm = g(leaf(3, 4), leaf(3, 4))  # compiles the forward only
    T.check_classes(warm, True, expect=1)
    del warm
    torch.manual_seed(0)
    inputs = [(torch.randn(3, 4), torch.randn(3, 4)) for _ in range(4)]

    def run(k, n, results):
        x0, w0 = inputs[k]
        grads = []
        for i in range(n):
            x = x0.clone().requires_grad_()
            w = (w0 + i).requires_grad_()
            out = g(x, w)
            torch.autograd.backward(out, [torch.ones(3, 3), torch.ones(3, 4)])
            grads.append((x.grad, w.grad, out[0].detach(), out[1].detach()))
        results[k] = grads

    threaded: dict = {}
    errors = []

    def target(k):
        try:
            run(k, 100, threaded)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=target, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # references: single-threaded, with this C function and with upstream's
    reference: dict = {}
    for k in range(4):
        run(k, 100, reference)
    torch._dynamo.reset()
    with T.c_runtime(False):
        g = aot_function(f_many_saved, fw_compiler=nop, bw_compiler=nop)
        T.check_classes(g(leaf(3, 4), leaf(3, 4)), False, expect=1)
    upstream: dict = {}
    for k in range(4):
        run(k, 100, upstream)
    for k in range(4):
        for i, (a, b, c) in enumerate(zip(threaded[k], reference[k], upstream[k])):
            for x, y, z in zip(a, b, c):
                assert torch.equal(x, y) and torch.equal(x, z), (k, i)
    assert rec.compiles >= 1


# ---------------------------------------------------------------------------
# functorch transforms


def _transform_calls(g):
    return {
        "grad": lambda: torch.func.grad(lambda x: g(x, torch.ones(3)).sum())(torch.randn(3)),
        "vmap": lambda: torch.func.vmap(lambda x: g(x, torch.ones(3)))(torch.randn(2, 3)),
        "vjp": lambda: torch.func.vjp(lambda x: g(x, torch.ones(3)), torch.randn(3)),
        "jvp": lambda: torch.func.jvp(
            lambda x: g(x, torch.ones(3)), (torch.randn(3),), (torch.randn(3),)
        ),
    }


def f_vec(x, w):
    return x.sin() * w


@pytest.mark.parametrize("transform", ["grad", "vmap", "vjp", "jvp"])
def test_functorch_transforms(transform):
    """A compiled function (training graph) called inside a functorch
    transform: FunctionApply hands it to upstream's Function.apply; the same
    result or error."""
    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with T.c_runtime(use_c):
            g = aot_function(f_vec, fw_compiler=nop, bw_compiler=nop)
            out = g(leaf(3), leaf(3))
        T.check_classes(out, use_c, expect=1)
        torch.manual_seed(0)
        r = T._safe(_transform_calls(g)[transform])
        seen[use_c] = repr(r) if not isinstance(r, dict) else r
        assert D.tls_state() == D.tls_state()
    assert seen[False] == seen[True], seen


def test_grads_batched():
    """``torch.autograd.grad(..., is_grads_batched=True)``."""

    def run(outs, inputs):
        out = outs[0]
        v = torch.randn(2, *out.shape)
        return torch.autograd.grad(out, inputs.args, grad_outputs=v, is_grads_batched=True)

    differential(f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def dead_wrapper(*shape):
    """A functorch wrapper tensor that escaped its (finished) transform."""
    leaked = []

    def h(t):
        leaked.append(t)
        return (t * 2).sum()

    torch.func.grad(h)(torch.randn(*shape))
    assert torch._C._functorch.is_functorch_wrapped_tensor(leaked[0])
    return leaked[0]


def test_dead_functorch_wrapper_input():
    """An argument that is a dead functorch wrapper: Function.apply unwraps
    it (unwrap_dead_wrappers) before the forward; FunctionApply too (the
    C++ node declines a functorch wrapper and counts it)."""
    before = T.node_stats()
    differential(f_plain, lambda: (dead_wrapper(3, 4), leaf(3, 4)), cpp_node=False)
    if T.cpp_node_in_use():
        declined = T.node_stats_delta(before)
        assert declined == {"tensor subclass, functorch, functional or nested input": 2}, declined


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_backward_inside_transform(transform):
    """The compiled backward run inside a functorch transform (forward
    outside): upstream's prologue check raises; the same in C."""

    def run(outs, inputs):
        out, x = outs[0], inputs.args[0]

        def inner(v):
            (gx,) = torch.autograd.grad(out, x, grad_outputs=v, retain_graph=True)
            return gx.sum()

        if transform == "grad":
            return torch.func.grad(inner)(torch.ones(3, 4))
        return torch.func.vmap(inner)(torch.ones(2, 3, 4))

    off, on = differential(
        f_plain, lambda: (leaf(3, 4), leaf(3, 4)), backward=run,
        backward_error="RuntimeError",
    )
    bw = on.calls[0]["outputs"]["items"]["backward"]["items"]["message"]["value"]
    assert "within vmap/grad/vjp" in bw, bw


# ---------------------------------------------------------------------------
# compiled autograd, BackwardState, AOTAutogradCache


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_autograd(dynamic):
    """A training step compiled with aot_eager, its backward captured by
    compiled autograd (which reads the class' _lazy_backward_info, metadata,
    _bw_prologue_fn, ... and ctx.symints): the same grads, same captures.
    ``dynamic``: the batch size changes (saved symints in the key)."""
    from torch._dynamo import compiled_autograd
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model0 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 4)
    results = {}
    for use_c in (False, True):
        import copy

        torch._dynamo.reset()
        counters.clear()
        model = copy.deepcopy(model0)
        with T.c_runtime(use_c):
            cm = torch.compile(model, backend="aot_eager", dynamic=dynamic)
            with compiled_autograd._enable(torch.compile(backend="aot_eager")):
                grads = []
                for step in range(3):
                    model.zero_grad()
                    xs = x[: 5 - step] if dynamic else x
                    loss = cm(xs).pow(2).sum()
                    loss.backward()
                    grads.append([p.grad.clone() for p in model.parameters()])
        results[use_c] = (grads, dict(counters["compiled_autograd"]), loss.detach())
    D.assert_same(
        [[D.TensorValue(g) for g in gs] for gs in results[False][0]],
        [[D.TensorValue(g) for g in gs] for gs in results[True][0]],
    )
    assert results[False][1] == results[True][1] and results[True][1].get("captures"), results
    assert torch.equal(results[False][2], results[True][2])


def test_compiled_autograd_backward_state():
    """A hook registered on an intermediate inside the compiled region makes
    AOTAutograd pass a BackwardState (forward: ctx attribute; only compiled
    autograd can run that backward)."""
    from torch._dynamo import compiled_autograd

    def f(x, w):
        y = x * w
        y.register_hook(lambda g: g * 3)
        return (y.sin()).sum()

    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w = leaf(3, 4), leaf(3, 4)
        with T.c_runtime(use_c):
            with compiled_autograd._enable(torch.compile(backend="aot_eager")):
                out = torch.compile(f, backend="aot_eager")(x, w)
                # a BackwardState input: the C++ node keeps it as the ctx does
                classes = T.check_classes(out, use_c, expect=1)
                state = out.grad_fn._compiled_autograd_backward_state
                out.backward()
        results[use_c] = (D.TensorValue(x.grad), D.TensorValue(w.grad), len(classes),
                          type(state).__name__)
    assert results[True][3] == "BackwardState", results
    D.assert_same(results[False], results[True])


@pytest.mark.inductor
def test_autograd_cache_hit_builds_c_class():
    """AOTAutogradCache (inductor): an entry saved by a compile with the C
    runtime off, loaded with it on, builds a C CompiledFunction; loaded with
    it off, upstream's; the same results each time."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    def f(x, w):
        return torch.sin(x @ w).sum(0) * 2

    def step(use_c, expect):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        x, w = torch.randn(3, 4), leaf(4, 5)
        before = torch_aot_rt.stats()["serializable_functions"]
        with T.c_runtime(use_c):
            out = torch.compile(f, backend="inductor")(x, w)
        T.check_classes(out, use_c, expect=1)
        out.sum().backward()
        got = {k: v for k, v in counters["aot_autograd"].items() if "autograd_cache" in k}
        assert got.get(expect) == 1, got
        # a cache hit wraps the result in a SerializableCompiledFunction: with
        # the C path on, ours (the C __call__)
        grew = torch_aot_rt.stats()["serializable_functions"] - before
        if D.C_ENABLED:
            ours = use_c and expect == "autograd_cache_hit"
            assert grew == (1 if ours else 0), grew
        return out.detach(), w.grad

    with torch._functorch.config.patch(enable_autograd_cache=True), \
            torch._inductor.config.patch(fx_graph_cache=True):
        with fresh_cache():
            ref = step(False, "autograd_cache_miss")
            hit_on = step(True, "autograd_cache_hit")
            hit_off = step(False, "autograd_cache_hit")
        # an entry saved from the C path's lazy backward compile
        with fresh_cache():
            miss_on = step(True, "autograd_cache_miss")
            hit_off2 = step(False, "autograd_cache_hit")
            hit_on2 = step(True, "autograd_cache_hit")
    for r in (hit_on, hit_off, miss_on, hit_off2, hit_on2):
        assert torch.equal(r[0], ref[0]) and torch.equal(r[1], ref[1])


# ---------------------------------------------------------------------------
# functorch.config.debug_assert: the C CompiledFunction keeps it


def _debug_assert(flag):
    import torch._functorch.config as functorch_config

    return lambda: functorch_config.patch(debug_assert=flag)


@pytest.mark.parametrize("case", sorted(CASES))
def test_program_with_debug_assert(case):
    """Every program with ``debug_assert=True`` (upstream's own tests force it
    on): the C CompiledFunction is built (no fallback) and observes the same;
    the checks it adds (mutated inputs, aliased outputs) pass as upstream's."""
    fn, make_inputs, backward, check = CASES[case]
    differential(
        fn, make_inputs, backward=backward, bw_compiler_factory=T.RecordingBackward, calls=2,
        config=_debug_assert(True),
    )


@pytest.mark.parametrize("case", ["alias_of_input", "alias_of_intermediate", "data_mutation_requires_grad"])
@pytest.mark.parametrize("compiled_with", [False, True])
def test_debug_assert_switched_after_compile(case, compiled_with):
    """``debug_assert`` is read per forward, as upstream reads it: compiled
    with it one way and called with it the other, the same results."""
    fn, make_inputs, backward, _ = CASES[case]
    seen = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        with T.c_runtime(use_c), _debug_assert(compiled_with)():
            g = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
            g(*D._as_inputs(make_inputs()).args)
        with _debug_assert(not compiled_with)():
            inputs = D._as_inputs(make_inputs())
            seen[use_c] = D.observe_call(
                lambda args: g(*args), inputs
            )
    D.assert_same(seen[False], seen[True], "call")
