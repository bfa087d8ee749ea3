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


def _requires_hooks():
    if not isinstance(dynamo_utils.record_pregraph_bytecode_enter, torch_aot_rt._C.PregraphHook):
        reasons = [r for r in torch_aot_rt.stats()["fallback_reasons"] if "pregraph" in r]
        pytest.skip(f"the pregraph hooks stay upstream's on this torch: {reasons}")


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
    _requires_hooks()
    off, off_delta = _run(False, program)
    on, on_delta = _run(True, program)
    D.assert_same(off, on)
    assert set(off_delta) <= {"upstream calls: switched off, another wrapper or other arguments"}
    if c_calls is not None:
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
    _requires_hooks()
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
