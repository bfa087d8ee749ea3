"""The runtime wrapper's epilogue at the torch door: the mutation epilogue's
``copy_`` / ``detach().copy_`` / ``as_strided_`` / ``set_`` and the alias
replay's view replay, called through the C++ part where that is exact
(``torch_cpp_api.h`` ``epi_*``) and through the Python methods otherwise.

Every case is differential (C path off vs on, everything observable
compared through ``_differential``) and also checks which route the C path
took (``stats()["cpp_epilogue"]``): the C++ part where it is in use and the
call is plain; the Python method, as upstream, with a TorchFunctionMode or a
TorchDispatchMode active, a tensor subclass, or a case the C++ part leaves
to Python (a shape mismatch whose error upstream raises). With ``TORCH_AOT_RT_CPP=0`` the same
cases run the Python route only (nothing counted).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import weakref

import pytest
import torch

import _differential as D
import torch_aot_rt
from _cases import f_data, f_data_and_meta, f_meta_t
from _modes import RecordingDispatchMode, RecordingFunctionMode

pytestmark = pytest.mark.needs_c


def _cpp_in_use() -> bool:
    return D.C_ENABLED and torch_aot_rt.stats()["cpp"]["module"] is not None


def _routes() -> dict:
    return dict(torch_aot_rt.stats()["cpp_epilogue"])


def _delta(before: dict) -> dict:
    after = _routes()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _route_of(delta: dict) -> str | None:
    """The one route the counted calls took, or None when none was counted."""
    keys = sorted(delta)
    if not keys:
        return None
    assert len(keys) == 1, delta
    return {"taken": "cpp"}.get(keys[0].split(" ")[0], keys[0].split(" ")[0])


def _check_route(delta: dict, expected: str | None) -> None:
    """expected: "cpp", "declined" or "not" (offered), or None (not checked:
    whether the case reaches the door differs between releases); without
    the C++ part nothing is counted."""
    if expected is None:
        return
    if not _cpp_in_use():
        assert delta == {}, delta
    else:
        assert _route_of(delta) == expected, delta


# ---------------------------------------------------------------------------
# programs


def f_leaf_hidden(a, b):
    # a leaf that requires grad, mutated where autograd does not see it:
    # the epilogue's detach().copy_
    with torch.no_grad():
        a.mul_(2)
    return a * b


def f_buffer(x, buf):
    buf.add_(1)
    return x * buf


def f_view(a):
    return a.view(-1)


def f_view_of_view(a):
    return a[1:].t()[0]


def f_views(a):
    return a.t(), a[0], a.unsqueeze(0)


def f_intermediate_alias(a):
    b = a * 2
    return b, b.view(-1)


def f_alias_no_grad(a):
    # the base requires grad, the output not: patch_requires_grad detaches
    return a.detach().view(-1)


def _t(*shape, rg=False, device="cpu", dtype=torch.float32):
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(rg)


PROGRAMS = {
    # name: (fn, make_inputs(device), route of the epilogue's counted calls)
    "data": (f_data, lambda d: (_t(3, 4, device=d),), "cpp"),
    "data_double": (f_data, lambda d: (_t(3, 4, device=d, dtype=torch.float64),), "cpp"),
    "data_non_contiguous": (f_data, lambda d: (_t(4, 3, device=d).t(),), "cpp"),
    "metadata": (f_meta_t, lambda d: (_t(3, 4, device=d),), "cpp"),
    "data_and_metadata": (f_data_and_meta, lambda d: (_t(3, 4, device=d),), "cpp"),
    "leaf_requires_grad": (
        f_leaf_hidden,
        lambda d: D.Inputs((_t(3, device=d, rg=True), _t(3, device=d, rg=True))),
        "cpp",
    ),
    "buffer_training": (
        f_buffer,
        lambda d: D.Inputs((_t(3, device=d, rg=True), torch.zeros(3, device=d))),
        "cpp",
    ),
    "view": (f_view, lambda d: (_t(2, 3, device=d),), "cpp"),
    "view_of_view": (f_view_of_view, lambda d: (_t(3, 4, device=d),), "cpp"),
    "views": (f_views, lambda d: (_t(3, 4, device=d),), "cpp"),
    # inference: the second output is replayed from the first on some
    # releases (2.15), returned as is on others (2.13, 2.14)
    "intermediate_alias": (f_intermediate_alias, lambda d: (_t(3, device=d),), None),
    "intermediate_alias_training": (
        f_intermediate_alias, lambda d: D.Inputs((_t(3, device=d, rg=True),)), "cpp"
    ),
    "view_training": (f_views, lambda d: D.Inputs((_t(3, 4, device=d, rg=True),)), "cpp"),
    "view_training_non_leaf": (
        f_views,
        lambda d: D.Inputs((_t(3, 4, device=d, rg=True) * 1,), ()),
        "cpp",
    ),
    "alias_detached": (
        f_alias_no_grad, lambda d: D.Inputs((_t(3, 4, device=d, rg=True),)), "cpp"
    ),
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_epilogue_route(device, program):
    """Plain tensors, no mode: the C++ part runs the epilogue's operations,
    with everything observable upstream's."""
    fn, make, route = PROGRAMS[program]
    before = _routes()
    on = D.run_differential(fn, make, device=device)
    assert on.calls
    _check_route(_delta(before), route)


# ---------------------------------------------------------------------------
# where the C++ part must not run: the Python methods, as upstream

MODES = {"function": RecordingFunctionMode, "dispatch": RecordingDispatchMode}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("program", ["data", "metadata", "data_and_metadata", "view", "views",
                                     "leaf_requires_grad", "intermediate_alias_training",
                                     "alias_detached"])
def test_mode_active_takes_the_python_route(program, mode):
    """A TorchFunctionMode (which the methods' bindings hand the call to)
    or a TorchDispatchMode active around the call: the mode sees the very
    calls upstream makes, in the same order."""
    fn, make, route = PROGRAMS[program]
    logs = {}

    def ctx():
        log = logs.setdefault(len(logs), [])
        return MODES[mode](log)

    # the first call compiles, outside the mode; the second runs in it
    off = D.run_once(fn, make, use_c=False, ctx=[None, ctx], calls=2, backward=False)
    before = _routes()
    on = D.run_once(fn, make, use_c=True, ctx=[None, ctx], calls=2, backward=False)
    D.compare_runs(off, on)
    assert off.calls[1]["error"] is None, off.calls[1]["error"]
    assert logs[0], "the mode saw nothing: the case tests nothing"
    assert logs[0] == logs[1], (logs[0], logs[1])
    delta = _delta(before)
    if route is None:
        return
    if not _cpp_in_use():
        assert delta == {}, delta
        return
    # the first call (no mode) took the C++ part for each operation; the
    # second (in the mode) the Python route for as many
    by_route = {k.split(" ")[0]: v for k, v in delta.items()}
    expected = {"function": "not", "dispatch": "declined"}[mode]
    assert set(by_route) == {"taken", expected}, delta
    assert by_route["taken"] == by_route[expected] > 0, delta


class Marked(torch.Tensor):
    """A subclass whose __torch_function__ records the methods called on it."""

    calls: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def _capture(fn, make, **aot_kwargs):
    compiled_fn, kwargs = D.capture_wrapper_kwargs(fn, make())
    return compiled_fn, kwargs


def _both(up, ours, make, backward=False):
    recs = []
    for w in (up, ours):
        torch.manual_seed(0)
        args = tuple(make())
        recs.append(D.observe_call(lambda a, w=w: w(list(a)), D.Inputs(args), backward=backward))
    D.assert_same(recs[0], recs[1], "direct")
    return recs


@pytest.mark.parametrize("program", ["data", "metadata", "view"])
def test_subclass_input_takes_the_python_route(program):
    """A tensor subclass with a __torch_function__ as the mutated or aliased
    input (the wrapper built from a plain compile, called with it): its
    override sees the same method calls on both routes."""
    fn = {"data": f_data, "metadata": f_meta_t, "view": f_view}[program]
    compiled_fn, kwargs = _capture(fn, lambda: (_t(3, 4),))
    up, ours = D.build_pair(compiled_fn, kwargs)
    seen = []
    for w in (up, ours):
        w([_t(3, 4)])  # the first call runs under the custom-op aliasing check
    before = _routes()
    for w in (up, ours):
        Marked.calls = []
        torch.manual_seed(0)
        x = _t(3, 4).as_subclass(Marked)
        torch.manual_seed(0)
        rec = D.observe_call(lambda a, w=w: w(list(a)), D.Inputs((x,)), backward=False)
        seen.append((rec, list(Marked.calls)))
    D.assert_same(seen[0][0], seen[1][0], "subclass")
    assert seen[0][1] and seen[0][1] == seen[1][1], seen
    if _cpp_in_use():
        assert "taken" not in _delta(before), _delta(before)


# ---------------------------------------------------------------------------
# the direct route: compiled functions whose updates need what copy_ does
# beyond a plain copy, or raise


def _replacing(kwargs, produce):
    def compiled(args):
        return produce(args)

    compiled._boxed_call = True
    return compiled, kwargs


@pytest.mark.parametrize(
    "update",
    ["other_dtype", "broadcast", "non_contiguous", "wrong_shape", "int_from_float",
     "same_tensor", "zero_size_input"],
)
def test_copy_update_variants(update):
    """The updated value the compiled function returns for a mutated input
    is copied with copy_'s own semantics (dtype conversion, broadcasting,
    strides) and errors (type and message) on both routes."""
    compiled_fn, kwargs = _capture(f_data, lambda: (_t(3, 4),))
    produce_update = {
        "other_dtype": lambda a: torch.arange(12, dtype=torch.float64).view(3, 4),
        "broadcast": lambda a: torch.arange(4.0),
        "non_contiguous": lambda a: torch.arange(12.0).view(4, 3).t(),
        "wrong_shape": lambda a: torch.arange(5.0),
        "int_from_float": lambda a: torch.arange(12).view(3, 4),
        "same_tensor": lambda a: a,  # a no-op copy that still bumps the version
        "zero_size_input": lambda a: torch.ones(0, 4),
    }[update]
    compiled, kwargs = _replacing(kwargs, lambda args: [produce_update(args[0]), args[0] * 2])
    up, ours = D.build_pair(compiled, kwargs)
    before = _routes()
    shape = (0, 4) if update == "zero_size_input" else (3, 4)
    recs = _both(up, ours, lambda: (_t(*shape),))
    if update == "wrong_shape":
        assert recs[0]["error"] is not None and recs[0]["error"]["type"] == "RuntimeError"
    else:
        assert recs[0]["error"] is None, recs[0]["error"]
    _check_route(_delta(before), "cpp")


def test_metadata_update_variants():
    """as_strided_ from an update whose storage offset and strides differ
    from the input's (a view with an offset)."""
    compiled_fn, kwargs = _capture(f_meta_t, lambda: (_t(3, 4),))
    compiled, kwargs = _replacing(
        kwargs, lambda args: [args[0].detach().view(-1)[1:].as_strided((2, 3), (1, 2), 2),
                              args[0] * 2]
    )
    up, ours = D.build_pair(compiled, kwargs)
    before = _routes()
    recs = _both(up, ours, lambda: (_t(3, 4),))
    assert recs[0]["error"] is None, recs[0]["error"]
    _check_route(_delta(before), "cpp")


def _edit_input_info(kwargs, index=0, **changes):
    meta = copy.copy(kwargs["runtime_metadata"])
    meta.input_info = list(meta.input_info)
    meta.input_info[index] = dataclasses.replace(meta.input_info[index], **changes)
    return {**kwargs, "runtime_metadata": meta}


def test_set_storage_mutation_route():
    """set_ (under no_grad): the input takes the update's storage."""
    compiled_fn, kwargs = _capture(f_meta_t, lambda: (_t(3, 4),))
    kwargs = _edit_input_info(kwargs, mutates_storage_metadata=True)
    compiled, kwargs = _replacing(
        kwargs, lambda args: [torch.arange(12.0).view(4, 3), args[0] * 2]
    )
    up, ours = D.build_pair(compiled, kwargs)
    before = _routes()
    recs = _both(up, ours, lambda: (_t(3, 4),))
    assert recs[0]["error"] is None and recs[0]["inputs"][0]["storage_changed"], recs[0]
    _check_route(_delta(before), "cpp")


@pytest.mark.parametrize("requires_grad", [False, True])
def test_leaf_on_user_stream(requires_grad):
    """A leaf input mutated on a user stream (indices edited in): the
    generated epilogue (_codegen_input_mutations, 2.13 on) checks streams
    for non-leaves only, so a leaf is copied (detach().copy_ when it
    requires grad), with no error; 2.12's _apply_input_mutations lets only a
    leaf that requires grad through (leaf_mutation_checks_stream), the
    other raises before anything is copied."""
    compiled_fn, kwargs = _capture(f_data, lambda: (_t(3, 4),))
    meta = copy.copy(kwargs["runtime_metadata"])
    meta.mutated_inp_stream_indices = [0]
    kwargs = _edit_input_info({**kwargs, "runtime_metadata": meta}, is_leaf=True)
    up, ours = D.build_pair(compiled_fn, kwargs)
    before = _routes()
    recs = _both(up, ours, lambda: (_t(3, 4, rg=requires_grad),))
    if D.RELEASE.leaf_mutation_checks_stream and not requires_grad:
        assert recs[0]["error"]["type"] == "RuntimeError", recs[0]["error"]
        assert "user-specified streams" in recs[0]["error"]["message"], recs[0]["error"]
        _check_route(_delta(before), None)
        return
    assert recs[0]["error"] is None, recs[0]["error"]
    _check_route(_delta(before), "cpp")


def test_alias_shape_mismatch_raises_upstreams_error():
    """The regenerated view does not have the recorded shape: the C++ part
    declines and upstream's gen_alias_from_base raises its AssertionError."""
    compiled_fn, kwargs = _capture(f_view, lambda: (_t(2, 3),))
    compiled, kwargs = _replacing(kwargs, lambda args: [torch.ones(7)])
    up, ours = D.build_pair(compiled, kwargs)
    before = _routes()
    recs = _both(up, ours, lambda: (_t(2, 3),))
    assert recs[0]["error"] is not None and recs[0]["error"]["type"] == "AssertionError"
    _check_route(_delta(before), "declined")


# ---------------------------------------------------------------------------
# references


@pytest.mark.parametrize("program", ["data", "view", "views", "leaf_requires_grad"])
def test_no_leak_over_many_calls(program):
    """Many calls through the C++ routes leave no tensors and no references
    behind (inputs and outputs die with their last reference)."""
    fn, make, _ = PROGRAMS[program]
    torch._dynamo.reset()
    with D.runtime(True):
        g = torch._functorch.aot_autograd.aot_function(fn, fw_compiler=D.nop, bw_compiler=D.nop)
        inputs = D._as_inputs(make("cpu"))
        g(*inputs.args)
    gc.collect()
    alive = []
    for _ in range(200):
        inputs = D._as_inputs(make("cpu"))
        out = g(*inputs.args)
        alive.extend(weakref.ref(t) for t in D._flat_tensors(out))
        alive.extend(weakref.ref(t) for t in inputs.args)
        del out, inputs
    assert sum(w() is not None for w in alive) == 0


# ---------------------------------------------------------------------------
# the state a copy_ through the dispatcher depends on: each makes the C++
# part take the dispatcher (or the Python method), never the direct copy


def _call_in(ctx_factory, fn=f_data, make=lambda d: (_t(3, 4, device=d),), calls=2):
    """The program compiled by a first call outside ``ctx_factory()``, then
    called in it: both runs' records compared."""
    off = D.run_once(fn, make, use_c=False, ctx=[None, ctx_factory], calls=calls)
    on = D.run_once(fn, make, use_c=True, ctx=[None, ctx_factory], calls=calls)
    D.compare_runs(off, on)
    assert off.calls[1]["error"] is None, off.calls[1]["error"]
    return off, on


@pytest.mark.parametrize("ctx", ["inference_mode", "autocast", "no_grad"])
def test_mutation_under_tls_state(ctx):
    """Inference mode (no version bump on the way), autocast, no_grad
    around the call: upstream's results, version counters included."""
    factories = {
        "inference_mode": torch.inference_mode,
        "autocast": lambda: torch.autocast("cpu"),
        "no_grad": torch.no_grad,
    }
    _call_in(factories[ctx])


def test_mutation_under_the_profiler():
    """With the profiler on (RecordFunction callbacks), the epilogue's copy_
    is recorded as upstream's is: the same aten events in the same order."""
    from torch.profiler import ProfilerActivity, profile

    names = {}

    def run(use_c):
        torch._dynamo.reset()
        with D.runtime(use_c):
            g = torch._functorch.aot_autograd.aot_function(f_data, fw_compiler=D.nop)
            g(_t(3, 4))
            torch.manual_seed(0)
            x = _t(3, 4)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                g(x)
        return [e.name for e in prof.events() if e.name.startswith("aten::")], D.TensorValue(x)

    for use_c in (False, True):
        names[use_c] = run(use_c)
    assert "aten::copy_" in names[False][0], names[False][0]
    D.assert_same(names[False], names[True], "profiler events")


def test_copy_into_a_lazy_clone():
    """The mutated input shares a copy-on-write storage with another tensor
    (torch._lazy_clone): the copy materializes it, the other tensor keeps
    its values, on both routes."""

    def run(use_c):
        torch._dynamo.reset()
        with D.runtime(use_c):
            g = torch._functorch.aot_autograd.aot_function(f_data, fw_compiler=D.nop)
            g(_t(3, 4))
            torch.manual_seed(0)
            src = _t(3, 4)
            x = torch._lazy_clone(src)
            out = g(x)
        return D.TensorValue(src), D.TensorValue(x), D.TensorValue(out), x._version

    D.assert_same(run(False), run(True), "lazy clone")
