"""Dynamo's saved-tensor-hooks guard with the C check (``_C.SavedHooksGuard``,
installed by ``torch_aot_rt/_saved_hooks_guard.py``), C runtime off vs on.

The guard must pass exactly where upstream's passes and fail exactly where it
fails: compared here through what a user sees (results, recompilations,
gradients) over every state of the saved-tensor-hooks stack the guard looks at
(no hooks, Python-function hooks, fx.GraphModule hooks, mixed), and directly,
the C check against upstream's own formula for each state.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.fx
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd import utils as aot_utils

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c


def _gm_identity():
    return torch.fx.symbolic_trace(lambda t: t)


def _hooks_states():
    """name -> context manager factory for a saved-tensor-hooks state."""
    gm_pack, gm_unpack = _gm_identity(), _gm_identity()
    gm_pack2 = _gm_identity()
    py_pack, py_unpack = (lambda t: t), (lambda t: t)
    hooks = torch.autograd.graph.saved_tensors_hooks
    return {
        "none": lambda: D.contextlib.nullcontext(),
        "python": lambda: hooks(py_pack, py_unpack),
        "graph_modules": lambda: hooks(gm_pack, gm_unpack),
        "other_graph_modules": lambda: hooks(gm_pack2, gm_unpack),
        "mixed": lambda: hooks(gm_pack, py_unpack),
    }


def upstream_formula(expected):
    """Upstream's closure: hooks_ids_fn(get_hooks()) == guard_hooks_ids."""
    hooks = aot_utils.top_saved_tensors_hooks()
    ids = tuple(map(id, hooks)) if aot_utils.saved_tensors_hooks_are_inlineable(hooks) else None
    return expected == ids


def test_c_check_matches_upstream_formula_in_every_state():
    states = _hooks_states()
    expectations = []
    for name, ctx in states.items():  # the ids each state would be compiled with
        with ctx():
            hooks = aot_utils.top_saved_tensors_hooks()
            expectations.append(
                tuple(map(id, hooks)) if aot_utils.saved_tensors_hooks_are_inlineable(hooks)
                else None
            )
    for expected in expectations:
        guard = torch_aot_rt._C.SavedHooksGuard(expected)
        for name, ctx in states.items():
            with ctx():
                assert guard(None) is upstream_formula(expected), (expected, name)


def test_c_check_rejects_bad_plans():
    with pytest.raises(TypeError):
        torch_aot_rt._C.SavedHooksGuard([1, 2])
    with pytest.raises(TypeError):
        torch_aot_rt._C.SavedHooksGuard(None)(1, 2)


def f(x):
    return (x.sin() * 2).sum()


def run(use_c):
    """Compile under each hooks state in turn and call under every state:
    the results, gradients and Dynamo's frame/recompile counts."""
    states = _hooks_states()
    seen = []
    before = torch_aot_rt.stats()["guards"]
    with D.runtime(use_c):
        for compile_state, compile_ctx in states.items():
            torch._dynamo.reset()
            counters.clear()
            g = torch.compile(f, backend="aot_eager")
            x = torch.arange(4.0, requires_grad=True)
            with compile_ctx():
                g(x)
            for call_state, call_ctx in states.items():
                x = torch.arange(4.0, requires_grad=True)
                with call_ctx():
                    out = g(x)
                    out.backward()
                seen.append(
                    (compile_state, call_state, D.TensorValue(out), D.TensorValue(x.grad),
                     dict(counters["stats"]), dict(counters["frames"]))
                )
    built = torch_aot_rt.stats()["guards"] - before
    return seen, built


def test_same_guard_decisions_as_upstream():
    off, built_off = run(False)
    on, built_on = run(True)
    assert built_off == 0
    assert built_on >= len(_hooks_states())  # a C guard per compiled frame at least
    D.assert_same(off, on, "calls")
    # the guard really fails between inlineable hooks states: recompiles happened
    assert any(rec[4] != off[0][4] for rec in off), off


def test_replaced_helpers_fall_back_counted(monkeypatch):
    """Helpers replaced after install: upstream's builder runs (with the
    replacement, as upstream would call it), counted with the reason."""
    calls = []
    original = aot_utils.top_saved_tensors_hooks

    def spy():
        calls.append(1)
        return original()

    monkeypatch.setattr(aot_utils, "top_saved_tensors_hooks", spy)
    before = torch_aot_rt.stats()
    with D.runtime(True):
        torch._dynamo.reset()
        g = torch.compile(f, backend="aot_eager")
        g(torch.arange(4.0))
        n = len(calls)
        g(torch.arange(4.0))
    after = torch_aot_rt.stats()
    reason = "saved-tensors-hooks guard: AOTAutograd's saved-tensors-hooks helpers were replaced"
    assert after["fallback_reasons"].get(reason, 0) > before["fallback_reasons"].get(reason, 0)
    assert after["guards"] == before["guards"]
    assert len(calls) > n  # upstream's guard, calling the replacement per call
