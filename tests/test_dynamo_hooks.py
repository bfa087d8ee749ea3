"""The functions Dynamo's transformed bytecode calls around a graph's
argument preparation, ``torch._dynamo.utils.record_pregraph_bytecode_enter``
and ``_exit``, in C (``_C.PregraphHook``, csrc/dynamo/pregraph.c), against
upstream's: the same program with the C runtime off (the hooks then call
upstream's functions) and on, compared: results, the profiler's events,
recompiles and the errors of the stances, the eval-frame callback the body
runs under, and the hooks called by hand (errors word for word).
"""

from __future__ import annotations

import pytest
import torch
import torch._C._dynamo.eval_frame as c_eval_frame
import torch._dynamo.utils as dynamo_utils

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c


def _pregraph_counts():
    return torch_aot_rt.stats()["dynamo_pregraph"]


def _hooks_in_c() -> bool:
    """Whether the hooks are the C ones; where not (2.11, whose per-call
    layers stay upstream's; 2.15, whose bytecode calls them only under the
    profiler), that they are upstream's functions."""
    hook = dynamo_utils.record_pregraph_bytecode_enter
    per_call = D.RELEASE is None or D.RELEASE.pregraph_per_call
    if isinstance(hook, torch_aot_rt._C.PregraphHook):
        assert per_call
        return True
    assert not (D.LAYERS_MIRRORED and per_call), torch_aot_rt.stats()["fallback_reasons"]
    assert type(hook).__name__ == "function" and hook.__name__ == "record_pregraph_bytecode_enter"
    return False


def _delta(before):
    after = _pregraph_counts()
    return {k: v - before[k] for k, v in after.items() if v != before[k]}


def f(x, y):
    return (x * y).sin() + 1


def _run(use_c, program):
    torch._dynamo.reset()
    torch.manual_seed(0)
    before = _pregraph_counts()
    with D.runtime(use_c):
        out = program()
    return out, _delta(before)


def differential(program, *, c_calls=None):
    """``program()`` with the C runtime off, then on: the same result; the
    on run's hook calls all in C (``c_calls`` of them when given)."""
    in_c = _hooks_in_c()
    off, off_delta = _run(False, program)
    on, on_delta = _run(True, program)
    D.assert_same(off, on)
    assert set(off_delta) <= {"upstream calls: switched off, another wrapper or other arguments"}
    if c_calls is not None and in_c:
        assert on_delta == ({"calls in C": c_calls} if c_calls else {}), on_delta
    return off, on_delta


def _values(ts):
    return [D.TensorValue(t) for t in ts]


def test_calls_in_c():
    """Three calls of a compiled function: an enter and an exit each."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, y = torch.randn(4), torch.randn(4)
        return _values([g(x, y) for _ in range(3)])

    differential(program, c_calls=6)


def test_profiler_events():
    """Under the profiler the enter opens a "Pregraph bytecode" range and
    the exit closes it: the same events as upstream's."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, y = torch.randn(4), torch.randn(4)
        g(x, y)
        with torch.profiler.profile() as prof:
            out = g(x, y)
        names = sorted(e.name for e in prof.events() if e.name == "Pregraph bytecode")
        return _values([out]), names

    r, _ = differential(program)
    assert r[1] == ["Pregraph bytecode"], r


def test_record_runtime_overhead_off():
    """Without record_runtime_overhead the bytecode calls neither hook."""

    def program():
        with torch._dynamo.config.patch(record_runtime_overhead=False):
            g = torch.compile(f, backend="aot_eager")
            x, y = torch.randn(4), torch.randn(4)
            return _values([g(x, y), g(x, y)])

    differential(program, c_calls=0)


@pytest.mark.parametrize("stance", ["eager_on_recompile", "fail_on_recompile", "force_eager"])
def test_stances(stance):
    """Under a stance the disable wrapper's callback is the stance's: the
    hooks run upstream's wrapper (counted); results, recompiles and the
    fail_on_recompile error as upstream's."""
    from torch._dynamo.utils import counters

    def program():
        counters.clear()
        g = torch.compile(f, backend="aot_eager")
        x, y = torch.randn(4), torch.randn(4)
        first = g(x, y)
        with torch.compiler.set_stance(stance):
            same = g(x, y)
            try:
                other = _values([g(torch.randn(2, 3), torch.randn(2, 3))])
            except Exception as e:  # noqa: BLE001 - the error is the observation
                other = D.error_record(e)
        return _values([first, same]), other, dict(counters["stats"])

    differential(program)


def test_called_by_hand():
    """Called directly: what enter returns (a context manager entered, whose
    exit returns None), exit on it, and the errors for wrong arguments and
    for an object that is no context manager, word for word; the eval-frame
    callback the body saw and the one left after."""
    _hooks_in_c()
    enter = dynamo_utils.record_pregraph_bytecode_enter
    exit_ = dynamo_utils.record_pregraph_bytecode_exit

    def run(use_c):
        with D.runtime(use_c):
            cm = enter()
            rec = {
                "enter_result": cm.__enter__() is None,
                "exit": exit_(cm),
                "callback_after": repr(c_eval_frame.get_eval_frame_callback()),
                "extra_arg": D.error_record(D.raised(lambda: enter(1))),
                "missing_arg": D.error_record(D.raised(exit_)),
                "not_a_cm": D.error_record(D.raised(lambda: exit_(object()))),
            }
            with torch.profiler.profile():
                ranged = enter()
                rec["ranged"] = type(ranged).__name__
                rec["ranged_exit"] = exit_(ranged)
        return rec

    off, on = run(False), run(True)
    D.assert_same(off, on)


def _graph_globals():
    return {k: v for k, v in globals().items() if k.startswith("__compiled_fn")}


def test_compiled_graph_global_is_c():
    """The frame's __compiled_fn global Dynamo installs is a DisabledCall
    over the graph's disable wrapper when compiled with the C runtime on
    (counted), upstream's wrapper when off; it answers the wrapper's
    attributes (Dynamo unwraps with _torchdynamo_orig_callable)."""
    unavailable = torch_aot_rt.stats()["dynamo_disable"]["unavailable"]

    def run(use_c):
        torch._dynamo.reset()
        before = dict(_graph_globals())
        with D.runtime(use_c):
            g = torch.compile(f, backend="aot_eager")
            g(torch.randn(4), torch.randn(4))
        new = [v for k, v in _graph_globals().items() if k not in before]
        assert len(new) == 1, new
        (obj,) = new
        return type(obj).__name__, obj._torchdynamo_disable, callable(obj._torchdynamo_orig_callable)

    off, on = run(False), run(True)
    assert off == ("function", True, True), off
    # 2.11: the disable wrapper stays upstream's with the other layers
    assert on == (off if unavailable else ("DisabledCall", True, True)), (on, unavailable)


def test_exception_inside_the_graph():
    """An exception raised inside the compiled graph (an index out of
    range): the same exception, and the eval-frame callback, grad mode and
    dispatch TLS as before the call."""

    def h(x, i):
        return x[i] * 2

    def program():
        g = torch.compile(h, backend="aot_eager")
        x = torch.randn(4)
        g(x, torch.tensor([1]))
        state = (repr(c_eval_frame.get_eval_frame_callback()), torch.is_grad_enabled(),
                 str(torch._C._dispatch_tls_local_include_set()),
                 str(torch._C._dispatch_tls_local_exclude_set()))
        try:
            g(x, torch.tensor([7]))
            err = None
        except Exception as e:  # noqa: BLE001 - the error is the observation
            err = D.error_record(e)
        after = (repr(c_eval_frame.get_eval_frame_callback()), torch.is_grad_enabled(),
                 str(torch._C._dispatch_tls_local_include_set()),
                 str(torch._C._dispatch_tls_local_exclude_set()))
        return err, state == after

    r, _ = differential(program)
    assert r[0] is not None and r[1], r
