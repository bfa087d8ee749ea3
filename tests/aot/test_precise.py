"""Precise cases through ``aot_function`` with no-op compilers: one case per
behaviour of ``_create_runtime_wrapper`` (mutation epilogue branches, alias
replay handlers, arity and splitting, grad mode), each in inference (plain
inputs, ``no_grad`` over inputs that require grad, ``inference_mode``) and in
training, C runtime off vs on.

Each case also checks, on the metadata AOTAutograd produced, that it reaches
the branch it is named after: if torch stops generating that metadata, the
case fails instead of silently testing something else.
"""

from __future__ import annotations

import pytest
import torch

import _differential as D

from _cases import *  # noqa: F403  (the f_* programs, MODES, ctx_for, inputs_for)


def run(fn, shapes, mode, device, mutated=(), **kw):
    kw.setdefault("compile", "aot_function")
    return D.run_differential(
        fn,
        inputs_for(shapes, mode, mutated, dtypes=kw.pop("dtypes", None), nan=kw.pop("nan", False)),
        ctx=ctx_for(mode),
        device=device,
        **kw,
    )


def expect_trace_joint(on, mode):
    assert on.meta["trace_joint"] == (mode == "train"), on.meta


# ---------------------------------------------------------------------------
# no mutation



@pytest.mark.parametrize("mode", MODES)
def test_no_mutation(device, mode):
    on = run(f_plain, [(3, 4), (3, 4)], mode, device, nan=True)
    expect_trace_joint(on, mode)
    assert on.meta["mutated"] == [] and on.meta["outputs"] == ["non_alias"]


def test_no_mutation_functorch_nop(device):
    """The same through functorch.compile.nop (an unboxed graph module)."""
    on = run(f_plain, [(3, 4), (3, 4)], "train", device, compile="aot_function_nop")
    assert on.meta["trace_joint"]


# ---------------------------------------------------------------------------
# input mutations










MUTATION_CASES = {
    # name: (fn, shapes, mutated, expected mutation record)
    "data": (f_data, [(3, 4)], (0,), {"data": True, "metadata": False}),
    "data_returned": (f_data_returned, [(3, 4)], (0,), {"data": True, "metadata": False}),
    "metadata_t_": (f_meta_t, [(3, 4)], (0,), {"data": False, "metadata": True}),
    "metadata_unsqueeze_": (f_meta_unsqueeze, [(3, 4)], (0,), {"data": False, "metadata": True}),
    "metadata_transpose_": (f_meta_transpose, [(3, 4)], (0,), {"data": False, "metadata": True}),
    "data_and_metadata": (f_data_and_meta, [(3, 4)], (0,), {"data": True, "metadata": True}),
    "two_inputs": (f_two_mutations, [(4, 4), (4, 4)], (0, 1), None),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(MUTATION_CASES))
def test_input_mutation(device, mode, case):
    fn, shapes, mutated, expected = MUTATION_CASES[case]
    on = run(fn, shapes, mode, device, mutated=mutated)
    expect_trace_joint(on, mode)
    assert on.meta["mutated"] == list(mutated), on.meta
    if expected is not None:
        got = on.meta["mutations"][0]
        assert {k: got[k] for k in expected} == expected, got
    # the input really changed, the same way in both runs (compared above)
    first = on.calls[0]["inputs"][mutated[0]]
    assert first["version_delta"] != 0 or first["shape"] != tuple(shapes[mutated[0]]) or (
        first["stride"] != torch.empty(shapes[mutated[0]]).stride()
    )




@pytest.mark.parametrize("fn", [f_leaf_detach_mut, f_leaf_no_grad_mut], ids=["detach", "no_grad"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_leaf_mutation_hidden_from_autograd(device, fn, requires_grad):
    """The ``detach().copy_`` branch: a leaf that requires grad, mutated only
    in ways autograd does not see; and the same leaf not requiring grad
    (plain ``copy_``)."""

    def factory(d):
        return (torch.randn(3, 4, device=d, requires_grad=requires_grad),)

    on = D.run_differential(fn, factory, device=device)
    assert on.meta["mutated"] == [0] and on.meta["mutations"][0]["leaf"], on.meta
    assert on.calls[0]["inputs"][0]["version_delta"] > 0


@pytest.mark.parametrize("mode", ["plain", "train"])
def test_mutation_of_view_input(device, mode):
    """A (non-leaf, in training) view of a bigger tensor, mutated in place:
    the base sees the mutation."""

    def factory(d):
        base = torch.randn(4, 5, device=d, requires_grad=(mode == "train"))
        b = base.clone() if mode == "train" else base
        return D.Inputs((b[1],), (base,) if mode == "train" else (b,))

    on = D.run_differential(f_data, factory, device=device)
    assert on.meta["mutated"] == [0], on.meta
    assert on.meta["mutations"][0]["leaf"] == (mode != "train"), on.meta


@pytest.mark.parametrize("mode", MODES)
def test_metadata_mutation_then_alias(device, mode):
    """A metadata-mutated input that an output also aliases. In training,
    upstream's alias regeneration raises after the mutation epilogue ran (a
    torch bug as of 2.13): the same error and the same input state are
    expected from the C path."""
    on = run(
        f_meta_then_alias,
        [(3, 4)],
        mode,
        device,
        mutated=(0,),
        expect_error="RuntimeError" if mode == "train" else None,
    )
    assert on.meta["mutated"] == [0] and on.meta["outputs"][0] == "alias_of_input"


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
def test_keep_input_mutations_bumps_version(device, mode):
    """keep_inference_input_mutations: the graph mutates the input itself and
    the wrapper only bumps its version counter for autograd."""
    on = run(
        f_data, [(3, 4)], mode, device, compile_kwargs={"keep_inference_input_mutations": True}
    )
    assert on.meta["keep_input_mutations"] and on.meta["bump"] == [0], on.meta
    assert on.meta["mutated"] == []
    assert on.calls[0]["inputs"][0]["version_delta"] >= 2  # graph's copy_ + the bump


# ---------------------------------------------------------------------------
# outputs that alias inputs










ALIAS_INPUT_CASES = {
    "view": (f_view, [(3, 4)], ["alias_of_input"]),
    "select": (f_select, [(3, 4)], ["alias_of_input"]),
    "t": (f_t, [(3, 4)], ["alias_of_input"]),
    "is_input": (f_identity, [(3, 4)], ["is_input"]),
    "unsqueeze": (f_unsqueeze, [(3, 4)], ["alias_of_input"]),
    "is_input_and_compute": (f_identity_and_compute, [(3, 4)], ["is_input", "non_alias"]),
    "many_views": (
        f_many_views,
        [(3, 4), (3, 4)],
        ["non_alias"] + ["alias_of_input"] * 3 + ["is_input"] + ["alias_of_input"] * 2,
    ),
    "requires_grad_differs": (
        f_detached_view_of_input,
        [(3, 4), (3, 4)],
        ["non_alias", "alias_of_input"],
    ),
    "view_made_under_no_grad": (f_no_grad_view, [(3, 4), (3, 4)], ["non_alias", "alias_of_input"]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(ALIAS_INPUT_CASES))
def test_output_aliases_input(device, mode, case):
    fn, shapes, kinds = ALIAS_INPUT_CASES[case]
    on = run(fn, shapes, mode, device)
    assert on.meta["outputs"] == kinds, on.meta


# ---------------------------------------------------------------------------
# outputs that alias intermediates








ALIAS_INTERMEDIATE_CASES = {
    "single_view": (f_interm_view, [(3, 4)], None),
    "base_is_user_output": (
        f_interm_base_is_output,
        [(3, 4)],
        ["non_alias", "alias_of_intermediate_base_is_user_output"],
    ),
    "many_views": (
        f_interm_many,
        [(3, 4)],
        ["alias_of_intermediate_save_as_output", "alias_of_intermediate", "alias_of_intermediate"],
    ),
    "chain": (
        f_interm_chain,
        [(3, 4)],
        ["alias_of_intermediate_save_as_output", "alias_of_intermediate"],
    ),
    "requires_grad_differs": (
        f_interm_detached,
        [(3, 4)],
        ["non_alias", "alias_of_intermediate_base_is_user_output"],
    ),
    "two_bases": (f_interm_two_bases, [(3, 4), (3, 4)], None),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(ALIAS_INTERMEDIATE_CASES))
def test_output_aliases_intermediate(device, mode, case):
    fn, shapes, kinds = ALIAS_INTERMEDIATE_CASES[case]
    on = run(fn, shapes, mode, device)
    if kinds is not None and mode == "train":
        # in inference the views are plain outputs; in training they are
        # regenerated from their base
        assert on.meta["outputs"] == kinds, on.meta
    if mode == "train" and case == "requires_grad_differs":
        assert on.meta["output_requires_grad"] == [True, False]


# ---------------------------------------------------------------------------
# mixed outputs




@pytest.mark.parametrize("mode", MODES)
def test_non_tensor_outputs(device, mode):
    on = run(f_nontensor, [(3, 4), (3, 4)], mode, device)
    assert len(on.meta["outputs"]) == 4


@pytest.mark.parametrize("mode", MODES)
def test_everything_at_once(device, mode):
    on = run(
        f_everything,
        [(3, 4), (4, 4), (3, 4), (5,)],
        mode,
        device,
        mutated=(0, 1),
        dtypes={3: torch.int64},
    )
    assert on.meta["mutated"] == [0, 1, 3], on.meta
    assert "alias_of_input" in on.meta["outputs"] and "is_input" in on.meta["outputs"]



def test_indices_of_inps_to_detach(device):
    """A non-leaf input that requires grad but gets no gradient: the training
    wrapper detaches it before the call."""

    def factory(d):
        a = torch.randn(3, device=d, requires_grad=True)
        base = torch.randn(3, device=d, requires_grad=True)
        return D.Inputs((a, base.clone()), (base,))

    on = D.run_differential(f_detach_input, factory, device=device)
    assert on.meta["trace_joint"] and on.meta["detach"] == [1], on.meta



@pytest.mark.parametrize("mode", ["plain", "train"])
def test_grad_enabled_mutation(device, mode):
    on = run(f_sets_grad_off, [(3,)], mode, device, backward=False)
    # 2.11: a training compile downgraded to inference (here: no output
    # requires grad) loses grad_enabled_mutation; upstream's call then leaves
    # grad mode as the graph left it (the differential run compares that)
    keeps = D.RELEASE is None or D.RELEASE.downgrade_keeps_grad_enabled_mutation
    expected = False if mode == "plain" or keeps else None
    assert on.meta["grad_enabled_mutation"] is expected, on.meta
    assert on.calls[0]["tls_after"]["grad"] is False


def test_aot_module(device):
    """aot_module: parameters are inputs that require grad; their gradients
    are compared too."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count.add_(1)
            y = self.lin(x)
            return y, y.t(), x.view(-1)

    on = D.run_differential(
        M, lambda d: (torch.randn(2, 4, device=d),), compile="aot_module", device=device
    )
    assert on.meta["trace_joint"] and on.meta["mutated"], on.meta


def test_many_inputs_captured(device):
    """More captured inputs than the C wrapper keeps on its stack."""
    n = 12

    def fn(*xs):
        for x in xs[::2]:
            x.add_(1)
        return tuple(x.view(-1) for x in xs[1::2])

    on = run(fn, [(2, 3)] * n, "plain", device)
    assert len(on.meta["mutated"]) == n // 2


def f_mut_first_use_second(a, b):
    a.add_(1)
    return b * 2, a.view(-1)


@pytest.mark.parametrize("mode", ["plain", "train"])
def test_duplicate_inputs(device, mode):
    """The same tensor passed twice (AOTDedupeWrapper around the runtime
    wrapper)."""

    def factory(d):
        base = torch.randn(3, device=d, requires_grad=(mode == "train"))
        x = base.clone() if mode == "train" else base
        return D.Inputs((x, x), (base,) if mode == "train" else ())

    D.run_differential(f_mut_first_use_second, factory, device=device)


@pytest.mark.parametrize("mode", ["plain", "train"])
def test_aliased_view_inputs(device, mode):
    """Two views of one base, one mutated (AOTSyntheticBaseWrapper around the
    runtime wrapper)."""

    def factory(d):
        base = torch.randn(2, 3, device=d, requires_grad=(mode == "train"))
        b = base.clone() if mode == "train" else base
        return D.Inputs((b[0], b[1]), (base,) if mode == "train" else (b,))

    D.run_differential(f_mut_first_use_second, factory, device=device)


def f_param_step(p, x):
    y = (p * x).sum()
    with torch.no_grad():
        p.add_(1)
    return y, p.view(-1)


def test_parameter_mutated_under_no_grad(device):
    """An nn.Parameter (a leaf that requires grad) updated in place under
    no_grad: the ``detach().copy_`` branch on a Parameter."""

    def factory(d):
        return D.Inputs(
            (torch.nn.Parameter(torch.randn(3, device=d)), torch.randn(3, device=d))
        )

    on = D.run_differential(f_param_step, factory, device=device)
    assert on.meta["mutations"][0]["leaf"] and on.calls[0]["inputs"][0]["pytype"] == "Parameter"


@pytest.mark.parametrize("fn", [f_view, f_identity_and_compute, f_data], ids=lambda f: f.__name__)
def test_view_input_of_non_leaf(device, fn):
    """Training with an input that is a view of a non-leaf: outputs that
    alias it are regenerated from a view, and a mutation reaches the base."""

    def factory(d):
        leaf = torch.randn(4, 3, 4, device=d, requires_grad=True)
        return D.Inputs((leaf.clone()[1],), (leaf,))

    D.run_differential(fn, factory, device=device)
