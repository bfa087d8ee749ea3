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

The programs are in ``_autograd_programs.py``; the backward, the class and
its memory, and transforms are in the test_autograd_* files beside this one.
"""

from __future__ import annotations

import sys

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
import _training as T
from _training import differential, leaf, nonleaf

from _autograd_programs import (
    CASES, f_conv, f_dynamic, f_matmul, f_metadata_mutation,
    f_metadata_mutation_transpose_alias, f_plain, meta_of, mutations, randn_grads, types,
)


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
