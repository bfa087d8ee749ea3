"""The functions of torch._dynamo.utils Dynamo's transformed bytecode calls
per call, in C (``_C.BytecodeHelper``, csrc/dynamo/bytecode_helper.c):
``record_pregraph_bytecode_enter`` and ``_exit`` around a graph's argument
preparation, ``call_size``, ``call_stride`` and ``call_storage_offset`` for
its dynamic sizes; against upstream's: the same program with the C runtime
off (the hooks then call upstream's functions) and on, compared: results,
the profiler's events, recompiles and the errors of the stances, the
eval-frame callback the body runs under, and the hooks called by hand
(errors word for word).
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
    return torch_aot_rt.stats()["dynamo_bytecode_helpers"]


def _hooks_in_c(name="record_pregraph_bytecode_enter") -> bool:
    """Whether the hook is the C one; where not (for the pregraph pair 2.15,
    whose bytecode calls them only under the profiler), that it is upstream's
    function."""
    hook = getattr(dynamo_utils, name)
    per_call = D.RELEASE is None or D.RELEASE.pregraph_per_call or not name.startswith("record_")
    if isinstance(hook, torch_aot_rt._C.BytecodeHelper):
        assert per_call
        return True
    assert not per_call, torch_aot_rt.stats()["fallback_reasons"]
    assert type(hook).__name__ == "function" and hook.__name__ == name
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


def test_dynamic_sizes_in_c():
    """dynamic=True: the bytecode reads the graph's dynamic sizes through
    call_size (and, as the inputs need, call_stride, call_storage_offset),
    every one in C; results and recompiles as upstream's."""
    from torch._dynamo.utils import counters
    in_c = _hooks_in_c("call_size")
    pregraph = _hooks_in_c()

    def h(x, y):
        return (x[1:] * 2).sum(0) + y.shape[0]

    def program():
        counters.clear()
        g = torch.compile(h, backend="aot_eager", dynamic=True)
        outs = []
        for n in (3, 4, 5, 6):
            base = torch.randn(n + 2, n)
            outs.append(_values([g(base[1:, :].t(), torch.randn(n))]))
        return outs, dict(counters["stats"])

    _, delta = differential(program)
    calls = delta.get("calls in C", 0)
    if in_c:
        # the three steady-state calls at least: a size each, and the
        # pregraph pair where it is C
        assert calls >= 3 * (1 + 2 * pregraph), delta
        assert set(delta) == {"calls in C"}, delta


class _Logged(torch.Tensor):
    """A subclass whose __torch_function__ records the eval-frame callback
    it ran under (None inside a disabled function)."""
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append((getattr(func, "__name__", repr(func)),
                         c_eval_frame.get_eval_frame_callback() is None))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_tensor_properties_called_by_hand():
    """call_size, call_stride and call_storage_offset called directly: their
    results, a subclass's __torch_function__ and the callback it ran under,
    and the errors (out of range, not a tensor, wrong arguments) word for
    word."""
    _hooks_in_c("call_size")
    size, stride, offset = (dynamo_utils.call_size, dynamo_utils.call_stride,
                            dynamo_utils.call_storage_offset)
    x = torch.randn(5, 6)[1:, ::2]
    sub = torch.randn(2, 3).as_subclass(_Logged)

    def run(use_c):
        _Logged.seen.clear()
        with D.runtime(use_c):
            rec = {
                "values": (size(x, 0), size(x, -1), stride(x, 1), offset(x)),
                "subclass": (size(sub, 1), stride(sub, 0), offset(sub)),
                "range": D.error_record(D.raised(lambda: size(x, 2))),
                "not_a_tensor": D.error_record(D.raised(lambda: stride(3, 0))),
                "missing": D.error_record(D.raised(lambda: size(x))),
                "extra": D.error_record(D.raised(lambda: offset(x, 0))),
                "keyword": size(x, i=0),
                "callback_after": repr(c_eval_frame.get_eval_frame_callback()),
            }
        rec["seen"] = list(_Logged.seen)
        return rec

    off, on = run(False), run(True)
    D.assert_same(off, on)
    assert off["seen"] and all(inside for _, inside in off["seen"]), off["seen"]


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
    # where install left the disable wrapper upstream's, "unavailable" says why
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
