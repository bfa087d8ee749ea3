"""Error paths, C runtime off vs on: a compiled graph that raises (in
inference and training, under autocast, inlined saved-tensor hooks, the
profiler, the first-invocation check), a compiled graph that returns the
wrong number of outputs. The exception (type and message) and every piece of
thread-local state afterwards must match, and the wrapper must stay usable.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from functorch.compile import aot_function, nop

import _differential as D
from _cases import *  # noqa: F403  (the f_* programs, MODES, ctx_for, inputs_for)
from test_features import autocast, f_bad_custom_op, inlineable_hooks


def raising_compiler(exc=ValueError("boom from the compiled graph"), on_calls=(0,)):
    """An observing no-op compiler whose graph raises ``exc`` on the listed
    calls (counted per compiled graph)."""
    count = [0]

    def before(args):
        k = count[0]
        count[0] += 1
        if k in on_calls:
            raise exc

    def compile(fn):
        count[0] = 0
        return aot_function(
            fn, fw_compiler=D.observing_compiler("fw", before=before), bw_compiler=nop
        )

    return compile


@contextlib.contextmanager
def everything():
    """autocast, inlineable saved-tensor hooks, and view replay off."""
    with autocast(), inlineable_hooks():
        yield


@pytest.mark.parametrize("mode", MODES)
def test_compiled_graph_raises(device, mode):
    on = D.run_differential(
        f_interm_many,
        inputs_for([(3, 4)], mode),
        ctx=ctx_for(mode),
        compile=raising_compiler(),
        device=device,
        calls=3,
        expect_error="ValueError",
    )
    # the first call raised, the later ones did not (the wrapper is reusable)
    assert [c["error"] is None for c in on.calls] == [False, True, True]


@pytest.mark.parametrize("mode", ["plain", "train"])
def test_compiled_graph_raises_under_everything(device, mode):
    """Autocast disabled for the call, hooks disabled, view replay and grad
    mode switched: all restored after the exception."""
    on = D.run_differential(
        f_saves_and_views,
        inputs_for([(3, 4)], mode),
        ctx=everything,
        compile_ctx=everything,
        compile=raising_compiler(on_calls=(0, 2)),
        device=device,
        calls=3,
        expect_error="ValueError",
    )
    assert on.meta["disable_amp"]
    state = on.calls[0]["tls_in_ctx"]
    assert state["autocast_cpu"] and state["saved_hooks_disabled"] is None


def f_saves_and_views(a):
    y = (a.sin() * a).cos()
    return y, y.t()


def test_compiled_graph_raises_with_mutation(device):
    """The graph raises before any mutation is written back: the input is
    left as it was."""
    on = D.run_differential(
        f_data,
        inputs_for([(3, 4)], "train", mutated=(0,)),
        compile=raising_compiler(),
        device=device,
        expect_error="ValueError",
    )
    assert on.calls[0]["inputs"][0]["version_delta"] == 0


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt(), SystemExit(3), RuntimeError("rt")],
    ids=["KeyboardInterrupt", "SystemExit", "RuntimeError"],
)
def test_base_exceptions_propagate(device, exc):
    """BaseExceptions go through the C wrapper untouched, state restored."""
    outcomes = []
    for use_c in (False, True):
        with D.runtime(use_c):
            g = raising_compiler(exc)(f_plain)
            x, y = torch.randn(3, device=device, requires_grad=True), torch.randn(3, device=device)
            before = D.tls_state()
            try:
                g(x, y)
                outcomes.append(None)
            except BaseException as e:  # noqa: BLE001
                outcomes.append((type(e), str(e), D.tls_state() == before))
    assert outcomes[0] == outcomes[1] and outcomes[0][2], outcomes


def test_first_invocation_check_with_raising_graph():
    """The custom-op check mode is pushed for the first call: a graph that
    raises must not leave it on the dispatch stack; the check is spent."""
    on = D.run_differential(
        f_bad_custom_op,
        inputs_for([(3, 4)], "plain"),
        compile=raising_compiler(),
        calls=2,
        expect_error="ValueError",
    )
    assert on.calls[0]["tls_in_ctx"]["dispatch_modes"] == 0
    assert not any("custom operator" in m for _, m in on.calls[1]["warnings"])


# ---------------------------------------------------------------------------
# wrong number of outputs from the compiled graph


def arity_compiler(delta):
    def compiler(gm, example_inputs):
        def run(args):
            outs = list(gm(*args))
            if delta > 0:
                outs += [torch.zeros(())] * delta
            else:
                outs = outs[:delta]
            return outs

        run._boxed_call = True
        return run

    return lambda fn: aot_function(fn, fw_compiler=compiler, bw_compiler=nop)


def f_mut_two(a, b):
    a.add_(1)
    return a * b, b.view(-1)


@pytest.mark.parametrize("delta", [1, -1], ids=["too_many", "too_few"])
@pytest.mark.parametrize("mode", ["plain", "inference_mode"])
def test_wrong_number_of_outputs(device, mode, delta):
    """``expected N outputs, got M`` from the runtime wrapper itself."""
    on = D.run_differential(
        f_mut_two,
        inputs_for([(3, 4), (3, 4)], mode),
        ctx=ctx_for(mode),
        compile=arity_compiler(delta),
        device=device,
        expect_error="AssertionError",
    )
    assert on.calls[0]["error"]["message"].startswith("expected "), on.calls[0]["error"]
    assert on.calls[0]["inputs"][0]["version_delta"] == 0  # nothing written back


@pytest.mark.parametrize("delta", [1, -1], ids=["too_many", "too_few"])
def test_wrong_number_of_outputs_training(device, delta):
    """In training the CompiledFunction sits between the graph and the runtime
    wrapper: whatever it raises, both runs raise the same."""
    kw = dict(compile=arity_compiler(delta), device=device, backward=False)
    off = D.run_once(f_interm_many, inputs_for([(3, 4)], "train"), use_c=False, **kw)
    on = D.run_once(f_interm_many, inputs_for([(3, 4)], "train"), use_c=True, **kw)
    D.check_runtime_used(on)
    D.compare_runs(off, on)
    if delta < 0:  # an extra output passes upstream as one more saved tensor
        assert off.calls[0]["error"] is not None


# ---------------------------------------------------------------------------
# the profiler range on the error path


@pytest.mark.parametrize("requires_grad", [False, True])
def test_profiler_range_closed_on_error(device, requires_grad):
    names = {}
    for use_c in (False, True):
        with D.runtime(use_c):
            g = raising_compiler(on_calls=(1,))(f_plain)

            def args():
                return (
                    torch.randn(3, device=device, requires_grad=requires_grad),
                    torch.randn(3, device=device),
                )

            g(*args())  # compiles; call 0 succeeds
        with torch._dynamo.config.patch(record_runtime_overhead=True):
            with torch.profiler.profile() as prof:
                with pytest.raises(ValueError):
                    g(*args())  # call 1 raises inside the range
                g(*args())  # call 2 succeeds
        names[use_c] = sorted(e.name for e in prof.events())
    assert names[False] == names[True]
    assert names[True].count("AOTDispatcher Runtime Wrapper Prologue") == 2
