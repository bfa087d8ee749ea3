"""How the compile_wrapper tests run a program with the C runtime off and on
and compare the runs, and the thread-local state they read after each call.
"""

from __future__ import annotations

import torch
import torch._C._dynamo.eval_frame as c_eval_frame
from torch._dynamo.utils import counters

import _differential as D
import torch_aot_rt


C_CALL = "calls in C"
MODULE_UPSTREAM = ("OptimizedModule upstream calls: compiled with the C runtime off, a global "
                   "module hook or a helper replaced")


def _counts():
    return torch_aot_rt.stats()["dynamo_compile_wrapper"]


def _check_in_c() -> None:
    """torch.compile returns the C object here."""
    with D.runtime(True):
        f = torch.compile(lambda x: x, backend="eager")
    assert torch_aot_rt._C._is_c_compile_wrapper(f), (
        type(f), torch_aot_rt.stats()["fallback_reasons"])


def _peek(setter, probe):
    """What a C setter of eval_frame's thread-local state holds (it returns
    the prior value), put back."""
    prior = setter(probe)
    setter(prior)
    return repr(prior)


def tls_state():
    state = {
        "callback": repr(c_eval_frame.get_eval_frame_callback()),
        "grad": torch.is_grad_enabled(),
        "include": str(torch._C._dispatch_tls_local_include_set()),
        "exclude": str(torch._C._dispatch_tls_local_exclude_set()),
        "layers": torch._C._functorch.get_dynamic_layer_stack_depth(),
        "skip_guard_eval_unsafe": c_eval_frame.set_skip_guard_eval_unsafe(False),
    }
    # what fullgraph sets around the call: 2.12 on the nested-compile flag
    # and frame count, 2.11 the eval-frame override; 2.13 on the
    # isolate-recompiles id
    for name, probe in (("set_fullgraph_error_on_nested_compile", False),
                        ("set_fullgraph_compiled_frame_count", -1),
                        ("set_eval_frame_isolate_recompiles_id", -1)):
        if hasattr(c_eval_frame, name):
            state[name] = _peek(getattr(c_eval_frame, name), probe)
    if hasattr(c_eval_frame, "set_eval_frame_override"):
        import torch._dynamo.eval_frame as eval_frame

        state["override"] = _peek(c_eval_frame.set_eval_frame_override,
                                  eval_frame._EvalFrameOverride.NONE)
    return state


def _attempt(fn):
    try:
        return {"value": fn()}
    except Exception as e:  # noqa: BLE001 - the error is the observation
        return D.exception_record(e) | {
            "suppress_context": e.__suppress_context__,
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
        }


def _run(use_c, program):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    before = _counts()
    with D.runtime(use_c):
        out = program()
    after = _counts()
    return out, {k: v - before[k] for k, v in after.items() if v != before[k]}


def differential(program, *, min_c=0):
    """``program()`` off, then on: the same observations; the on run's
    calls in C at least ``min_c``."""
    _check_in_c()
    off, off_counts = _run(False, program)
    on, on_counts = _run(True, program)
    D.assert_same(off, on)
    # OptimizedModule.__call__ is the C one for every module: those compiled
    # off run upstream's through it, counted
    assert set(off_counts) <= {MODULE_UPSTREAM}, off_counts
    assert on_counts.get(C_CALL, 0) >= min_c, on_counts
    return off, on_counts


def _v(t):
    return D.TensorValue(t) if isinstance(t, torch.Tensor) else t


def f(x, w):
    return (x * w).sin().sum(0)
