"""The runtime wrapper's cross-cutting features, C runtime off vs on:
autocast (``disable_amp``), ``view_replay_for_aliased_outputs``, the profiler
range, the custom-op aliasing check of the first invocation, saved-tensor
hooks (inlined and not), dynamic output dims, and grad-mode mutation inside a
``torch.compile`` region.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from functorch.compile import aot_function, nop
from torch.fx.experimental.proxy_tensor import make_fx

import _differential as D
from _cases import *  # noqa: F403  (the f_* programs, MODES, ctx_for, inputs_for)


def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def autocast_on(device):
    """The autocast of ``device``'s type, as a context factory."""
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    return lambda: torch.autocast(torch.device(device).type, dtype=dtype)


def f_matmul(a, b):
    y = a @ b
    return y, y.t(), (a + 1).view(-1)


# ---------------------------------------------------------------------------
# autocast


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("compile", ["aot_function", "aot_eager_observe"])
def test_autocast_disable_amp(device, compile, requires_grad):
    """Compiled and called under autocast: the graph runs under
    _DisableAutocast (the observing compiler records that) and autocast is on
    again afterwards."""
    on = D.run_differential(
        f_matmul,
        inputs_for([(3, 4), (4, 5)], "train" if requires_grad else "plain"),
        ctx=autocast_on(device),
        compile=compile,
        device=device,
    )
    assert on.meta["disable_amp"], on.meta
    key = f"autocast_{torch.device(device).type}"
    inner = [s for tag, s in on.calls[0]["inner"] if tag == "fw"]
    assert inner and not inner[0][key], on.calls[0]["inner"]
    assert on.calls[0]["tls_in_ctx"][key]


def test_autocast_compiled_inside_called_outside(device):
    """aot_function compiles once: a wrapper built with disable_amp, later
    called without autocast, and then under it again."""
    D.run_differential(
        f_matmul,
        inputs_for([(3, 4), (4, 5)], "train"),
        ctx=[autocast_on(device), None, autocast_on(device)],
        calls=3,
        device=device,
    )


# ---------------------------------------------------------------------------
# view replay of aliased outputs


@pytest.mark.parametrize("replay", [True, False])
@pytest.mark.parametrize(
    "fn", [f_many_views, f_interm_many, f_interm_base_is_output], ids=lambda f: f.__name__
)
def test_view_replay_config(device, replay, fn):
    shapes = [(3, 4), (3, 4)] if fn is f_many_views else [(3, 4)]
    on = D.run_differential(
        fn,
        inputs_for(shapes, "train"),
        functorch_config={"view_replay_for_aliased_outputs": replay},
        device=device,
    )
    assert on.meta["trace_joint"]
    # the training wrapper forces view replay on for the call, restores it after
    inner = [s for tag, s in on.calls[0]["inner"] if tag == "fw"]
    assert inner[0]["view_replay"] and not on.calls[0]["tls_after"]["view_replay"]


def test_view_replay_already_enabled(device):
    """View replay already on in the caller: the training wrapper leaves it on."""

    @contextlib.contextmanager
    def replay_on():
        prev = torch._C._is_view_replay_enabled()
        torch._C._set_view_replay_enabled(True)
        try:
            yield
        finally:
            torch._C._set_view_replay_enabled(prev)

    on = D.run_differential(
        f_interm_many, inputs_for([(3, 4)], "train"), ctx=replay_on, device=device
    )
    assert on.calls[0]["tls_in_ctx"]["view_replay"]


# ---------------------------------------------------------------------------
# profiler


def _profiled_event_names(use_c, fn, make_args, record_overhead):
    with D.runtime(use_c):
        g = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        g(*make_args())  # compile outside the profiler
    with torch._dynamo.config.patch(record_runtime_overhead=record_overhead):
        with torch.profiler.profile() as prof:
            g(*make_args())
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("record_overhead", [True, False])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_profiler_prologue_range(device, record_overhead, requires_grad):
    def make_args():
        return (torch.randn(3, 4, device=device, requires_grad=requires_grad),)

    names = {}
    for use_c in (False, True):
        names[use_c] = _profiled_event_names(use_c, f_interm_many, make_args, record_overhead)
    assert names[False] == names[True]
    assert ("AOTDispatcher Runtime Wrapper Prologue" in names[True]) == record_overhead


# ---------------------------------------------------------------------------
# custom-op aliasing check on the first invocation

_lib = torch.library.Library("aotrt_test", "FRAGMENT")
_lib.define("bad_alias(Tensor x) -> Tensor")
_lib.define("good(Tensor x) -> Tensor")
_lib.impl("bad_alias", lambda x: x.view(-1), "CompositeExplicitAutograd")
_lib.impl("good", lambda x: x.clone().view(-1), "CompositeExplicitAutograd")


@torch.library.register_fake("aotrt_test::bad_alias", lib=_lib)
def _bad_alias_fake(x):
    return torch.empty_like(x).view(-1)


@torch.library.register_fake("aotrt_test::good", lib=_lib)
def _good_fake(x):
    return torch.empty_like(x).view(-1)


def f_bad_custom_op(a):
    return torch.ops.aotrt_test.bad_alias(a) * 2


def f_good_custom_op(a):
    return torch.ops.aotrt_test.good(a) * 2


def _custom_op_calls(use_c, compile, fn, configs):
    """Compile once; call once per config dict; record (error, warnings with
    file and line) per call."""
    torch._dynamo.reset()
    out = []
    with D.runtime(use_c):
        g = (
            aot_function(fn, fw_compiler=nop, bw_compiler=nop)
            if compile == "aot_function"
            else torch.compile(fn, backend="aot_eager", fullgraph=True)
        )
        for cfg in configs:
            with torch._functorch.config.patch(**cfg), warnings.catch_warnings(
                record=True
            ) as caught:
                warnings.simplefilter("always")
                try:
                    g(torch.randn(3, 4))
                    err = None
                except RuntimeError as e:
                    err = str(e)
            out.append(
                (
                    err,
                    [
                        (w.category.__name__, str(w.message), w.filename, w.lineno)
                        for w in caught
                        if "custom operator" in str(w.message)
                    ],
                    D.tls_state(),
                )
            )
    return out


CUSTOM_OP_SCENARIOS = {
    # first call warns, second does not
    "warn_once": [{}, {}],
    # first call raises, and the check is spent all the same
    "error_once": [{"error_on_custom_op_aliasing": True}] * 2,
    # the check is off on the first call: it is not spent, the second call checks
    "deferred": [{"check_custom_op_aliasing": False}, {}, {}],
}


@pytest.mark.parametrize("compile", ["aot_function", "aot_eager"])
@pytest.mark.parametrize("scenario", sorted(CUSTOM_OP_SCENARIOS))
def test_custom_op_aliasing_first_invocation(compile, scenario):
    configs = CUSTOM_OP_SCENARIOS[scenario]
    off = _custom_op_calls(False, compile, f_bad_custom_op, configs)
    on = _custom_op_calls(True, compile, f_bad_custom_op, configs)
    D.assert_same(off, on, scenario)
    checked = [bool(err or warns) for err, warns, _ in off]
    expected = {
        "warn_once": [True, False],
        "error_once": [True, False],
        "deferred": [False, True, False],
    }[scenario]
    assert checked == expected, off


def test_custom_op_without_aliasing_is_quiet():
    off = _custom_op_calls(False, "aot_function", f_good_custom_op, [{}, {}])
    on = _custom_op_calls(True, "aot_function", f_good_custom_op, [{}, {}])
    D.assert_same(off, on)
    assert all(err is None and not w for err, w, _ in on)


# ---------------------------------------------------------------------------
# saved-tensor hooks


def f_saves(a):
    return (a.sin() * a).cos()


def _graph_hooks():
    pack = make_fx(lambda x: x * 1)(torch.randn(3))
    unpack = make_fx(lambda x: x * 1)(torch.randn(3))
    return pack, unpack


_HOOK_COUNTS = [0, 0]


def _py_pack(t):
    _HOOK_COUNTS[0] += 1
    return t


def _py_unpack(t):
    _HOOK_COUNTS[1] += 1
    return t


def inlineable_hooks():
    return torch.autograd.graph.saved_tensors_hooks(*_graph_hooks())


def python_hooks():
    return torch.autograd.graph.saved_tensors_hooks(_py_pack, _py_unpack)


@pytest.mark.parametrize("compile", ["aot_function", "aot_eager_observe"])
def test_inlineable_saved_tensor_hooks(device, compile):
    """Hooks specialised as GraphModules are inlined into the graphs; the
    training wrapper disables saved-tensor hooks around the call (the compiled
    graph sees them disabled) and enables them again after."""
    on = D.run_differential(
        f_saves,
        inputs_for([(3, 4)], "train"),
        ctx=inlineable_hooks,
        compile_ctx=inlineable_hooks,
        compile=compile,
        device=device,
    )
    inner = [s for tag, s in on.calls[0]["inner"] if tag == "fw"]
    assert inner[0]["saved_hooks_disabled"], inner
    assert on.calls[0]["tls_in_ctx"]["saved_hooks_disabled"] is None


def test_inlineable_hooks_already_disabled(device):
    """Saved-tensor hooks already disabled with another message by the caller:
    that message is what is restored."""

    @contextlib.contextmanager
    def hooks_and_disabled():
        with inlineable_hooks():
            torch._C._autograd._saved_tensors_hooks_disable("caller's message", False)
            try:
                yield
            finally:
                torch._C._autograd._saved_tensors_hooks_enable()

    on = D.run_differential(
        f_saves,
        inputs_for([(3, 4)], "train"),
        ctx=[inlineable_hooks, hooks_and_disabled],
        device=device,
    )
    assert on.calls[1]["tls_in_ctx"]["saved_hooks_disabled"] == "caller's message"


def test_inlineable_hooks_push_inside_region_raises(device):
    """A hook pushed while the compiled region runs is an error (upstream's
    message), and the hooks state is restored after it."""

    def push_hook(args):
        with torch.autograd.graph.saved_tensors_hooks(_py_pack, _py_unpack):
            pass

    def compile(fn):
        return aot_function(
            fn, fw_compiler=D.observing_compiler("fw", before=push_hook), bw_compiler=nop
        )

    on = D.run_differential(
        f_saves,
        inputs_for([(3, 4)], "train"),
        ctx=inlineable_hooks,
        compile=compile,
        device=device,
        expect_error="RuntimeError",
    )
    assert "Saved tensors hooks were specialized" in on.calls[0]["error"]["message"]
    assert on.calls[0]["tls_in_ctx"]["saved_hooks_disabled"] is None


def test_python_saved_tensor_hooks(device):
    """Ordinary (not inlineable) hooks: the wrapper leaves them alone; they
    run when CompiledFunction saves its tensors, as many times either way."""
    counts = {}
    for use_c in (False, True):
        _HOOK_COUNTS[:] = [0, 0]
        run = D.run_once(
            f_saves,
            inputs_for([(3, 4)], "train"),
            use_c=use_c,
            ctx=[None, python_hooks, python_hooks],
            calls=3,
            device=device,
        )
        D.check_runtime_used(run)
        counts[use_c] = (list(_HOOK_COUNTS), run)
    D.compare_runs(counts[False][1], counts[True][1])
    assert counts[False][0] == counts[True][0]
    assert counts[True][0][0] > 0 and counts[True][0][1] > 0
    assert counts[True][1].meta["trace_joint"]


# ---------------------------------------------------------------------------
# dynamic shapes


def _dynamic_inputs(shape_by_call, requires_grad=False, preset=None):
    def factory(device):
        shape = shape_by_call[D.call_index() % len(shape_by_call)]
        base = torch.randn(shape, device=device, requires_grad=requires_grad)
        t = base.clone() if requires_grad else base  # mutable in place
        if preset is not None:
            setattr(t, D.DYNAMIC_ATTR, set(preset))
        return D.Inputs((t,), (base,) if requires_grad else ())

    return factory


def f_dyn(a):
    return a * 2, a.view(-1), a.sum(0)


def f_dyn_is_input(a):
    # returning the (mutated) input itself goes through AOTAutograd as is_input
    return a.add_(1), a + 1


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("fn", [f_dyn, f_dyn_is_input], ids=lambda f: f.__name__)
def test_dynamic_output_dims(device, fn, requires_grad):
    on = D.run_differential(
        fn,
        _dynamic_inputs([(5, 4), (7, 3), (2, 9)], requires_grad),
        compile="aot_eager",
        compile_kwargs={"dynamic": True},
        calls=3,
        device=device,
        # the C CompiledFunction does not take symints saved for backward
        allow_fallback="saved-for-backward slice" if requires_grad else None,
    )
    assert on.meta["dynamic_outputs"], on.meta
    assert on.graphs["unique_graphs"] == 1  # no recompilation in either run
    assert all(item["dynamic_indices"] for item in on.calls[0]["outputs"]["items"])


def test_dynamic_dims_merge_with_existing_attribute(device):
    """An is_input output that already carries the attribute: the dims are
    added to the existing set."""
    on = D.run_differential(
        f_dyn_is_input,
        _dynamic_inputs([(5, 4), (6, 4)], preset={7}),
        compile="aot_eager",
        compile_kwargs={"dynamic": True},
        device=device,
    )
    assert on.meta["outputs"][0] == "is_input", on.meta
    dims = on.calls[0]["inputs"][0]["dynamic_indices"]
    assert 7 in dims and len(dims) > 1


def f_dyn_graph_break(a):
    b = a * 2
    torch._dynamo.graph_break()
    return b.view(-1) + 1, b


def test_dynamic_dims_across_graph_break(device):
    """The attribute propagates dynamism into the graph after a break: the
    number of graphs compiled must match."""
    D.run_differential(
        f_dyn_graph_break,
        _dynamic_inputs([(5, 4), (7, 4), (9, 4)]),
        compile="aot_eager",
        compile_kwargs={"dynamic": True, "fullgraph": False},
        calls=3,
        device=device,
        min_wrappers=2,
    )


# ---------------------------------------------------------------------------
# grad mode mutated inside a torch.compile region


def f_set_grad_enabled_false(a):
    torch.set_grad_enabled(False)
    return a * 2


def f_c_set_grad_enabled_false(a):
    torch._C._set_grad_enabled(False)
    return a.sin(), a.view(-1)


def f_set_grad_enabled_true(a):
    torch.set_grad_enabled(True)
    return a * 2


@pytest.mark.parametrize("mode", ["plain", "train", "no_grad"])
@pytest.mark.parametrize(
    "fn",
    [f_set_grad_enabled_false, f_c_set_grad_enabled_false, f_set_grad_enabled_true],
    ids=lambda f: f.__name__,
)
def test_grad_enabled_mutation_compile(device, fn, mode):
    on = D.run_differential(
        fn,
        inputs_for([(3, 4)], mode),
        ctx=ctx_for(mode),
        compile="aot_eager",
        device=device,
        backward=False,
    )
    final = fn is f_set_grad_enabled_true
    initial = mode != "no_grad"
    # recorded only when the region leaves grad mode other than it found it
    # (2.11: not where the training compile was downgraded to inference, as
    # it is here: no output requires grad)
    expected = None if final == initial else final
    if mode == "train" and D.RELEASE is not None and \
            not D.RELEASE.downgrade_keeps_grad_enabled_mutation:
        expected = None
    assert on.meta["grad_enabled_mutation"] is expected, on.meta
    # (2.11, downgraded: no epilogue sets it, the call leaves grad mode as it was)
    dropped = expected is None and final != initial
    assert on.calls[0]["tls_in_ctx"]["grad"] is (initial if dropped else final)


# ---------------------------------------------------------------------------
# a compiled graph that changes thread state itself


def _toggle(what):
    def before(args):
        if what == "grad_on":
            torch._C._set_grad_enabled(True)
        elif what == "grad_off":
            torch._C._set_grad_enabled(False)
        elif what == "view_replay_on":
            torch._C._set_view_replay_enabled(True)
        elif what == "view_replay_off":
            torch._C._set_view_replay_enabled(False)
        elif what == "autocast_on":
            torch.set_autocast_enabled("cpu", True)

    return before


@pytest.mark.parametrize("mode", ["plain", "no_grad", "train"])
@pytest.mark.parametrize(
    "what", ["grad_on", "grad_off", "view_replay_on", "view_replay_off", "autocast_on"]
)
def test_graph_changes_thread_state(device, mode, what):
    """Upstream restores grad mode only if it switched it, view replay only if
    it differs from before, and autocast through _DisableAutocast's exit: what
    a graph changes itself is left (or not) exactly the same way."""

    def compile(fn):
        return aot_function(
            fn, fw_compiler=D.observing_compiler("fw", before=_toggle(what)), bw_compiler=nop
        )

    D.run_differential(
        f_interm_many,
        inputs_for([(3, 4)], mode),
        ctx=ctx_for(mode),
        compile=compile,
        device=device,
        backward=False,
    )


@pytest.mark.parametrize("what", ["grad_off", "autocast_on"])
def test_graph_changes_thread_state_under_autocast(device, what):
    def compile(fn):
        return aot_function(
            fn, fw_compiler=D.observing_compiler("fw", before=_toggle(what)), bw_compiler=nop
        )

    D.run_differential(
        f_matmul,
        inputs_for([(3, 4), (4, 5)], "train"),
        ctx=autocast,
        compile=compile,
        device=device,
        backward=False,
    )


def test_training_graph_called_without_grad(device):
    """aot_function compiles once: a training wrapper later called under
    no_grad and inference_mode forces grad on for the graph."""
    D.run_differential(
        f_interm_many,
        inputs_for([(3, 4)], "train"),
        ctx=[None, torch.no_grad, torch.inference_mode, None],
        calls=4,
        device=device,
    )


def test_inference_tensors(device):
    """Inputs created in inference_mode, mutated and aliased, with the version
    bump of kept mutations (inference tensors have no version counter)."""

    def factory(d):
        with torch.inference_mode():
            return (torch.randn(3, 4, device=d), torch.randn(3, 4, device=d))

    def fn(a, b):
        a.add_(1)
        return a.view(-1), b * 2, b

    for compile, kw in (
        ("aot_function", {}),
        ("aot_function", {"keep_inference_input_mutations": True}),
        ("aot_eager", {}),
    ):
        D.run_differential(
            fn,
            factory,
            ctx=torch.inference_mode,
            compile=compile,
            compile_kwargs=kw,
            device=device,
        )
