"""``torch._dynamo.disable``'s wrapper around the compiled backward, in C
(``_C.DisabledCall``, ``torch_aot_rt/_disable.py``), against upstream's ``_fn``.

The same wrapper is called through upstream's ``_fn`` and through a
``DisabledCall`` over it, and everything observable is compared: results,
exceptions (and their ``__context__``), the eval-frame callback the wrapped
function sees and the one left after the call (with no prior callback and
with the run-only one), the stances, exporting, a replaced helper, and an
``fn`` whose ``__name__`` runs code (read by 2.13's wrapper, not by 2.14's).
End to end, compiled backwards run it in C, with gradients upstream's.
"""

from __future__ import annotations

import pytest
import torch
import torch._C._dynamo.eval_frame as c_eval_frame
import torch._dynamo.eval_frame as eval_frame

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c


def _counts():
    return torch_aot_rt.stats()["dynamo_disable"]


def _requires_bound():
    if _counts()["unavailable"] is not None:
        pytest.skip(f"no C disable wrapper on this torch: {_counts()['unavailable']}")


class Recorder:
    """What the wrapped function saw; optionally a __name__ that is code."""

    def __init__(self, fail=None):
        self.calls = []
        self.name_reads = 0
        self.fail = fail

    def __call__(self, *args, **kwargs):
        self.calls.append(
            (args, sorted(kwargs.items()), repr(c_eval_frame.get_eval_frame_callback()))
        )
        if self.fail is not None:
            raise self.fail
        return ("result", args)


class NamedRecorder(Recorder):
    @property
    def __name__(self):
        self.name_reads += 1
        return "named"


def _observe(call, recorder, *, prior=None):
    previous = c_eval_frame.set_eval_frame(prior)
    try:
        try:
            out = ("ok", call(1, 2, key="v"))
        except Exception as e:  # noqa: BLE001 - the exception is the observation
            out = ("raised", D.error_record(e), D.error_record(e.__context__)
                   if e.__context__ else None)
        after = repr(c_eval_frame.get_eval_frame_callback())
    finally:
        c_eval_frame.set_eval_frame(previous)
    return {"out": out, "after": after, "calls": recorder.calls,
            "name_reads": recorder.name_reads}


def _pair(make_recorder, **kw):
    """(upstream's record, ours, the C path counts of ours)"""
    _requires_bound()
    records = []
    for use_c in (False, True):
        rec = make_recorder()
        wrapper = torch._dynamo.disable(rec, reason="test")
        call = torch_aot_rt._C.DisabledCall(wrapper) if use_c else wrapper
        rec.name_reads = 0  # functools.wraps read it when wrapping
        before = dict(_counts())
        records.append(_observe(call, rec, **kw))
        after = _counts()
    delta = {k: after[k] - before[k] for k in after if k != "unavailable"}
    return records[0], records[1], delta


@pytest.mark.parametrize("prior", [None, False], ids=["no-callback", "run-only"])
def test_default_stance_in_c(prior):
    off, on, delta = _pair(Recorder, prior=prior)
    D.assert_same(off, on, "disable")
    assert delta["calls in C"] == 1


def test_exception_passes_through():
    off, on, delta = _pair(lambda: Recorder(fail=ValueError("boom")))
    D.assert_same(off, on, "disable")
    assert off["out"][0] == "raised" and delta["calls in C"] == 1


@pytest.mark.parametrize("stance", ["force_eager", "eager_on_recompile", "fail_on_recompile"])
def test_other_stances_run_upstreams(stance):
    with torch.compiler.set_stance(stance):
        off, on, delta = _pair(Recorder)
    D.assert_same(off, on, "disable")
    assert delta["upstream calls: a stance or callback"] == 1


def test_exporting_runs_upstreams(monkeypatch):
    monkeypatch.setattr(torch.compiler, "_is_exporting_flag", True)
    off, on, delta = _pair(Recorder)
    D.assert_same(off, on, "disable")
    assert delta["upstream calls: exporting"] == 1


def test_replaced_helper_runs_upstreams(monkeypatch):
    seen = []
    original = eval_frame._callback_from_stance

    def spy(callback):
        seen.append(callback)
        return original(callback)

    monkeypatch.setattr(eval_frame, "_callback_from_stance", spy)
    off, on, delta = _pair(Recorder)
    D.assert_same(off, on, "disable")
    assert len(seen) == 2 and delta["upstream calls: eval_frame helpers replaced"] == 1


class _CountingMeta(type):
    """A metaclass whose __name__ is code: 2.13's wrapper evaluates
    type(fn).__name__ (getattr's default) on every call."""
    reads = 0

    @property
    def __name__(cls):
        _CountingMeta.reads += 1
        return "counted"


class _TypeNamed(Recorder, metaclass=_CountingMeta):
    @property
    def name_reads(self):
        return _CountingMeta.reads

    @name_reads.setter
    def name_reads(self, value):
        _CountingMeta.reads = value


@pytest.mark.parametrize("make", [NamedRecorder, _TypeNamed], ids=["fn", "type(fn)"])
def test_name_that_runs_code(make):
    """fn.__name__, or the default type(fn).__name__, is code: 2.13's wrapper
    runs it on every call, so C leaves the call to upstream's."""
    off, on, delta = _pair(make)
    D.assert_same(off, on, "disable")
    skips = torch_aot_rt._state.release().disable_skips_none_callback
    assert off["name_reads"] == (0 if skips else 1)
    assert delta["calls in C" if skips else "upstream calls: fn.__name__ may run code"] == 1


class _Holder:
    def __init__(self):
        self.recorder = Recorder()

    def method(self, *args, **kwargs):
        return self.recorder(*args, **kwargs)


def test_bound_method_in_c():
    """A bound method (the eager backend's graph is gm.forward): its
    __name__ is its function's, read without running code: in C."""
    _requires_bound()
    records = []
    for use_c in (False, True):
        holder = _Holder()
        wrapper = torch._dynamo.disable(holder.method, reason="test")
        call = torch_aot_rt._C.DisabledCall(wrapper) if use_c else wrapper
        before = dict(_counts())
        records.append(_observe(call, holder.recorder))
        after = _counts()
    delta = {k: after[k] - before[k] for k in after if k != "unavailable" and after[k] != before[k]}
    D.assert_same(records[0], records[1], "disable")
    assert delta == {"calls in C": 1}, delta


@pytest.mark.parametrize("args", [[1, 2], (1, 2), 5], ids=["list", "tuple", "not-a-sequence"])
def test_boxed_function(args):
    """make_boxed_func's g under a disable wrapper (what inductor returns for
    a graph it leaves to the GraphModule, such as a + 1's backward): C calls
    its f with the arguments unpacked, without g's frame; anything but one
    list or tuple calls g (its error word for word)."""
    import sys

    from torch._functorch._aot_autograd.utils import make_boxed_func

    class Plain(Recorder):  # the same repr in both runs (the error names f)
        def __repr__(self):
            return "recorder"

    _requires_bound()
    records, frames = [], []
    for use_c in (False, True):
        rec = Plain()
        wrapper = torch._dynamo.disable(make_boxed_func(rec), reason="test")
        call = torch_aot_rt._C.DisabledCall(wrapper) if use_c else wrapper
        seen = []

        def profile(frame, event, arg, seen=seen):
            if event == "call" and frame.f_code.co_name == "g":
                seen.append(frame.f_code.co_filename.endswith("utils.py"))

        before = dict(_counts())
        sys.setprofile(profile)
        try:
            out = ("ok", call(args))
        except Exception as e:  # noqa: BLE001 - the exception is the observation
            out = ("raised", D.error_record(e))
        finally:
            sys.setprofile(None)
        after = _counts()
        records.append({"out": out, "calls": rec.calls,
                        "after": repr(c_eval_frame.get_eval_frame_callback())})
        frames.append(seen)
    D.assert_same(records[0], records[1], "disable")
    assert after["calls in C"] - before["calls in C"] == 1
    assert frames[0] == [True]
    assert frames[1] == ([] if isinstance(args, (list, tuple)) else [True]), frames


def test_only_disable_wrappers():
    _requires_bound()
    with pytest.raises(TypeError, match="disable wrapper"):
        torch_aot_rt._C.DisabledCall(lambda: None)
    with pytest.raises(TypeError):
        torch_aot_rt._C.DisabledCall()


def test_compiled_backward_end_to_end():
    def run(use_c):
        torch._dynamo.reset()
        before = dict(_counts())
        with D.runtime(use_c):
            f = torch.compile(lambda x, w: (x * w).sin().sum(), backend="aot_eager")
            x = torch.linspace(-1, 1, 5, requires_grad=True)
            w = torch.full((5,), 0.5, requires_grad=True)
            grads = []
            for _ in range(3):
                f(x, w).backward()
                grads.append((D.TensorValue(x.grad), D.TensorValue(w.grad)))
                x.grad = w.grad = None
            callback = repr(c_eval_frame.get_eval_frame_callback())
        after = _counts()
        return {"grads": grads, "callback": callback}, {
            k: after[k] - before[k] for k in after if k != "unavailable"
        }

    off, counts_off = run(False)
    on, counts_on = run(True)
    D.assert_same(off, on, "e2e")
    assert counts_off["built"] == 0
    if _counts()["unavailable"] is None:
        # the compiled backward's wrapper and the compiled graph's (the
        # frame's __compiled_fn global), three calls each; but on 2.11 the
        # first backward is the lazy compile's, upstream's _backward_impl,
        # which calls the new backward's wrapper itself
        lazy_first = not D.RELEASE.compiled_function_factory
        assert counts_on["built"] == 2 and counts_on["calls in C"] == 6 - lazy_first, counts_on


def test_leaks_nothing_over_many_calls():
    import gc
    import sys

    _requires_bound()
    def rec(*args, **kwargs):
        return args

    c = torch_aot_rt._C.DisabledCall(torch._dynamo.disable(rec))
    x = object()
    for _ in range(100):
        c(x, k=x)
    gc.collect()
    before = (sys.getrefcount(x), sys.getrefcount(rec), sys.getrefcount(c))
    for _ in range(1000):
        c(x, k=x)
    gc.collect()
    assert (sys.getrefcount(x), sys.getrefcount(rec), sys.getrefcount(c)) == before
