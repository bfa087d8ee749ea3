"""The harness can fail: a deliberately wrong runtime wrapper in place of the
C one must be caught by ``run_differential``. Runs in every mode (it does not
need the extension): the "on" run gets upstream's wrapper with one defect.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
import torch._functorch._aot_autograd.runtime_wrappers as rw

import _differential as D
from _cases import f_data, f_interm_base_is_output, f_plain, f_view, inputs_for


_real_runtime = D.runtime


def _sabotaged(defect):
    """A ``runtime(use_c)`` replacement: for the "on" run, every wrapper built
    is upstream's with ``defect(wrapper, args) -> result`` around its call."""

    @contextlib.contextmanager
    def runtime(use_c):
        with _real_runtime(False):
            if not use_c:
                yield
                return
            builder = rw._create_runtime_wrapper

            def build(compiled_fn, **kwargs):
                inner = builder(compiled_fn, **kwargs)

                def wrapper(args):
                    return defect(inner, args)

                return wrapper

            rw._create_runtime_wrapper = build
            try:
                yield
            finally:
                rw._create_runtime_wrapper = builder

    return runtime


def _contiguous_copies(inner, args):
    return [o.clone() if isinstance(o, torch.Tensor) else o for o in inner(args)]


def _leaves_grad_off(inner, args):
    out = inner(args)
    torch._C._set_grad_enabled(False)
    return out


def _extra_version_bump(inner, args):
    torch.autograd.graph.increment_version(args[0])
    return inner(args)


def _detached_outputs(inner, args):
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in inner(args)]


def _other_message(inner, args):
    try:
        return inner(args)
    except RuntimeError as e:
        raise RuntimeError(str(e) + " (C)") from None


def _view_replay_left_on(inner, args):
    out = inner(args)
    torch._C._set_view_replay_enabled(True)
    return out


def _no_epilogue_mutation(inner, args):
    # the input is replaced by a copy before the call: its mutation is lost
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    return inner(args)


def _perturbed_values(inner, args):
    out = inner(args)
    with torch.no_grad():
        return [o + 1e-7 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out]


def _raises(inner, args):
    raise ValueError("boom")


DEFECTS = {
    # name: (defect, fn, shapes, mode, where the harness must see it)
    "stride_and_base": (_contiguous_copies, f_view, [(3, 4)], "plain", "outputs.is_view"),
    "grad_mode_after": (_leaves_grad_off, f_plain, [(3,), (3,)], "plain", "tls_in_ctx.grad"),
    "version_counter": (
        _extra_version_bump, f_plain, [(3,), (3,)], "plain", "inputs[0].version_delta"
    ),
    "requires_grad": (_detached_outputs, f_plain, [(3,), (3,)], "train", "outputs.requires_grad"),
    "view_replay_after": (
        _view_replay_left_on, f_plain, [(3,), (3,)], "train", "tls_in_ctx.view_replay"
    ),
    "lost_mutation": (_no_epilogue_mutation, f_data, [(3, 4)], "plain", "inputs[0].value"),
    "values": (_perturbed_values, f_plain, [(3,), (3,)], "plain", "outputs.value"),
    "exception": (_raises, f_plain, [(3,), (3,)], "plain", "call[0].error"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_harness_catches(monkeypatch, defect):
    fn_defect, fn, shapes, mode, where = DEFECTS[defect]
    monkeypatch.setattr(D, "runtime", _sabotaged(fn_defect))
    monkeypatch.setattr(D, "check_runtime_used", lambda *a, **k: None)
    with pytest.raises(D.Mismatch, match=re.escape(where)):
        D.run_differential(fn, inputs_for(shapes, mode), device="cpu")


def test_harness_catches_exception_message(monkeypatch):
    """Same exception type, different message."""

    def compile(fn):
        from functorch.compile import aot_function, nop

        def boom(args):
            raise RuntimeError("from the graph")

        return aot_function(
            fn, fw_compiler=D.observing_compiler("fw", before=boom), bw_compiler=nop
        )

    monkeypatch.setattr(D, "runtime", _sabotaged(_other_message))
    monkeypatch.setattr(D, "check_runtime_used", lambda *a, **k: None)
    with pytest.raises(D.Mismatch, match="message"):
        D.run_differential(
            f_plain,
            inputs_for([(3,), (3,)], "plain"),
            compile=compile,
            expect_error="RuntimeError",
        )


def test_harness_passes_identical_runs():
    """And does not fail two runs of the same runtime (upstream twice)."""
    D.compare_runs(
        D.run_once(f_interm_base_is_output, inputs_for([(3, 4)], "train"), use_c=False),
        D.run_once(f_interm_base_is_output, inputs_for([(3, 4)], "train"), use_c=False),
    )


def test_check_runtime_used_rejects_upstream_wrapper():
    """An "on" run whose wrappers are upstream's is rejected."""
    if not D.C_ENABLED:
        pytest.skip("needs the C extension; TORCH_AOT_RT=0")
    run = D.run_once(f_plain, inputs_for([(3,), (3,)], "plain"), use_c=False)
    run.use_c = True
    with pytest.raises(AssertionError):
        D.check_runtime_used(run)
