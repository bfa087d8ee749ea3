"""The other per-call compiler wrappers of ``runtime_wrappers.py`` in C
(``torch_aot_rt/_wrappers.py``, ``csrc/aot/wrappers/*_wrapper.c``), C off vs on.

End to end, real programs reach each wrapper: the same tensor passed twice
and mutated (``AOTDedupeWrapper``), two aliased inputs with one mutated
(``AOTSyntheticBaseWrapper``, with and without a metadata mutation),
an effectful op (``EffectTokensWrapper``), ``config.debug_assert``
(``DebugAssertWrapper``); inference and training, through ``aot_function``
and ``torch.compile``. Directly, each C object is built by our
``post_compile`` from the same wrapper and metadata as upstream's and both
are called alike: results, the argument list afterwards, errors and their
messages, the calls that are not the plain case (which run upstream's
function), and reference counts over many calls. The functionalized-RNG
wrapper (CUDA only: its state helpers need a GPU) and the fakified-output
wrapper (inductor's first call) are tested directly, with stand-ins for
what they call.

The direct tests are in test_wrappers_direct.py; the helpers both use in
_wrapper_cases.py.
"""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch
import torch._functorch._aot_autograd.runtime_wrappers as rw
from functorch.compile import aot_function

import _differential as D
from _trace_log import read_artifacts, split_blocks
import torch_aot_rt

from _wrapper_cases import (
    CLOSURES, Recorder, SYNTHETIC_ALLOW, SYNTHETIC_IN_C, SYNTHETIC_UPSTREAM, _aot_config,
    _build_pair, _call_record, _check_synthetic_base, _closure_here, _forwarding_wrappers,
    _identity_of, _leak_check, _raise, _same_but_graph_ids, _upstream_post_compile,
    _wrapper_types, needs_synthetic_c,
)
from test_wrappers_direct import _outcome, _synthetic_wrapper


# ---------------------------------------------------------------------------
# end to end: dedupe


def f_dupe_mutated(a, b):
    a.mul_(2)
    return a + b


def f_dupe_read(a, b, c):
    return a * b + c


@pytest.mark.parametrize("requires_grad", [False, True])
def test_dedupe_e2e(device, requires_grad):
    def make(dev):
        if requires_grad:
            base = torch.randn(4, device=dev, requires_grad=True)
            x = base.clone()
            return D.Inputs((x, x), (base,))
        x = torch.randn(4, device=dev)
        return (x, x)

    on = D.run_differential(f_dupe_mutated, make, device=device, calls=3,
                            compile_kwargs={"keep_inference_input_mutations": True})
    if D.C_ENABLED:
        assert on.built("wrappers") >= 1, on.stats_after


def test_dedupe_unmutated_needs_no_wrapper():
    # strategy 1: an unmutated duplicate is detached into its own leaf, no
    # per-call wrapper at all
    def make(dev):
        x = torch.randn(3, device=dev)
        return (x, x, torch.randn(3, device=dev))

    on = D.run_differential(f_dupe_read, make, calls=2)
    if D.C_ENABLED:
        assert on.built("wrappers") == _forwarding_wrappers(on)


def test_dedupe_guard_bug_error():
    # compiled for (x, x), called with two distinct tensors: upstream's
    # guard-bug AssertionError, message included, and nothing called
    def make(dev):
        x = torch.randn(4, device=dev)
        if D.call_index() == 0:
            return (x, x)
        return (x, torch.randn(4, device=dev))

    off = D.run_once(f_dupe_mutated, make, use_c=False, calls=2, backward=False,
                     compile_kwargs={"keep_inference_input_mutations": True})
    on = D.run_once(f_dupe_mutated, make, use_c=True, calls=2, backward=False,
                    compile_kwargs={"keep_inference_input_mutations": True})
    err = off.calls[1]["error"]
    assert err is not None and err["type"] == "AssertionError"
    assert "would be a duplicate of" in err["message"], err
    assert "guard bug" in err["message"], err
    _same_but_graph_ids(off, on)


def test_dedupe_torch_compile(device):
    # Dynamo passes a duplicated tensor to AOTAutograd once (and guards on the
    # duplication): torch.compile never reaches AOTDedupeWrapper's runtime;
    # aot_function / aot_module (above) do
    def f(a, b):
        a.add_(1)
        return a * b

    def make(dev):
        x = torch.randn(4, device=dev)
        return (x, x)

    on = D.run_differential(f, make, device=device, calls=3, compile="aot_eager",
                            backward=False)
    if D.C_ENABLED:
        assert on.built("wrappers") == _forwarding_wrappers(on), on.stats_after


# ---------------------------------------------------------------------------
# end to end: synthetic bases


def f_alias_mutated(a, b):
    a.mul_(2)
    return a + 1, b * 3


def f_alias_meta_mutated(a, b):
    a.mul_(2)
    b.unsqueeze_(0)
    return a + 1


def _aliased(dev, requires_grad, how="overlap"):
    """Two inputs that alias: overlapping views of one tensor, or the tensor
    and a view of it (disjoint views need no synthetic base)."""
    base = torch.randn(6, device=dev, requires_grad=requires_grad)
    src = base.clone() if requires_grad else base
    a, b = (src[:4], src[2:]) if how == "overlap" else (src[:4], src)
    return D.Inputs((a, b), (base,) if requires_grad else ())


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("how", ["aot_function", "aot_eager"])
def test_synthetic_base_e2e(device, requires_grad, how):
    on = D.run_differential(
        f_alias_mutated, lambda dev: _aliased(dev, requires_grad), device=device, calls=3,
        compile=how, allow_fallback=SYNTHETIC_ALLOW,
        compile_kwargs={"keep_inference_input_mutations": True} if how == "aot_function" else {},
    )
    _check_synthetic_base(on)


def test_synthetic_base_view_and_base(device):
    on = D.run_differential(f_alias_mutated, lambda dev: _aliased(dev, False, "base"),
                            device=device, calls=2, compile="aot_eager",
                            allow_fallback=SYNTHETIC_ALLOW)
    _check_synthetic_base(on)


def test_synthetic_base_metadata_mutation(device):
    on = D.run_differential(f_alias_meta_mutated, lambda dev: _aliased(dev, False),
                            device=device, allow_fallback=SYNTHETIC_ALLOW, calls=3,
                            compile_kwargs={"keep_inference_input_mutations": True})
    _check_synthetic_base(on)


def test_synthetic_base_without_base(device):
    # two inputs that share a storage but are not views (no _base): the
    # synthetic base is rebuilt from the storage every call
    def make(dev):
        a = torch.randn(6, device=dev)
        b = torch.empty(0, device=dev).set_(a.untyped_storage(), 2, (4,), (1,))
        return (a, b)

    on = D.run_differential(f_alias_mutated, make, device=device, calls=3, backward=False,
                            compile_kwargs={"keep_inference_input_mutations": True},
                            allow_fallback=SYNTHETIC_ALLOW)
    _check_synthetic_base(on)


# ---------------------------------------------------------------------------
# end to end: effect tokens


def f_print(x):
    torch.ops.aten._print("torch_aot_rt effect token")
    return x * 2 + 1


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("how", ["aot_function", "aot_eager"])
def test_effect_tokens_e2e(device, requires_grad, how, capfd):
    def make(dev):
        return (torch.randn(3, device=dev, requires_grad=requires_grad),)

    on = D.run_differential(f_print, make, device=device, calls=3, compile=how)
    printed = capfd.readouterr().out
    assert printed.count("torch_aot_rt effect token") == 6, printed
    if D.C_ENABLED:
        assert on.built("wrappers") >= 1, on.stats_after


# ---------------------------------------------------------------------------
# end to end: debug asserts


def test_debug_assert_e2e(device):
    def f(x, y, n):
        return x * y + n

    def make(dev):
        return (torch.randn(3, device=dev, requires_grad=True), torch.randn(3, device=dev), 2)

    on = D.run_differential(f, make, device=device, calls=3,
                            functorch_config={"debug_assert": True})
    if D.C_ENABLED:
        assert on.built("wrappers") >= 1, on.stats_after


def test_debug_assert_error(device):
    def f(x, y):
        return x * y

    def make(dev):
        y = torch.randn(3, device=dev, requires_grad=D.call_index() == 1)
        return (torch.randn(3, device=dev, requires_grad=True), y)

    off = D.run_once(f, make, use_c=False, calls=2, backward=False,
                     functorch_config={"debug_assert": True})
    on = D.run_once(f, make, use_c=True, calls=2, backward=False,
                    functorch_config={"debug_assert": True})
    err = off.calls[1]["error"]
    assert err is not None and "would not require grad" in err["message"], err
    _same_but_graph_ids(off, on)


# ---------------------------------------------------------------------------
# switches and fallbacks


@pytest.mark.needs_c
def test_disabled_builds_upstreams():
    compiled = Recorder(lambda args: list(args))
    meta = types.SimpleNamespace(tokens={0: None})
    before = torch_aot_rt.stats()
    with torch_aot_rt.enabled(False):
        fn = rw.EffectTokensWrapper().post_compile(compiled, _aot_config(), runtime_metadata=meta)
    assert type(fn).__name__ == "function"
    after = torch_aot_rt.stats()
    assert after["wrappers"] == before["wrappers"]
    assert after["fallbacks"] == before["fallbacks"]


@pytest.mark.needs_c
def test_not_needed_returns_compiled_fn():
    compiled = Recorder(lambda args: list(args))
    before = torch_aot_rt.stats()
    meta = types.SimpleNamespace(tokens={}, is_rng_op_functionalized=False)
    with torch_aot_rt.enabled(True):
        for cls in (rw.EffectTokensWrapper, rw.FunctionalizedRngRuntimeWrapper):
            fn = cls().post_compile(compiled, _aot_config(), runtime_metadata=meta)
            if CLOSURES:
                # 2.12 wraps anyway: a closure that only passes the call on
                assert type(fn) is _wrapper_types()[-1], (cls, type(fn))
            else:
                assert fn is compiled, cls
        w = rw.AOTDedupeWrapper()
        w.needs_post_compile = False
        assert w.post_compile(compiled, _aot_config(), runtime_metadata=meta) is compiled
    assert torch_aot_rt.stats()["wrappers"] == before["wrappers"] + (2 if CLOSURES else 0)
    assert torch_aot_rt.stats()["fallbacks"] == before["fallbacks"]


@pytest.mark.needs_c
@pytest.mark.skipif(not CLOSURES, reason="2.12's closures: the release returns compiled_fn")
@pytest.mark.parametrize("cls_name", ["EffectTokensWrapper", "FunctionalizedRngRuntimeWrapper"])
def test_forwarding_closure_direct(cls_name):
    """2.12's effect-tokens closure without tokens and RNG closure without
    RNG functionalization, against the C object built from them: identity,
    results, the list afterwards, calls that are not the plain one, errors."""
    x = torch.randn(2)
    for make_out in (lambda args: [x, args[0] if args else None], lambda args: None, _raise):
        compiled = Recorder(make_out)
        meta = types.SimpleNamespace(tokens={}, is_rng_op_functionalized=False)
        cls = getattr(rw, cls_name)
        up, ours = _build_pair(cls, compiled, _aot_config(), meta)
        assert type(ours) is _wrapper_types()[-1]
        assert _identity_of(up) == _identity_of(ours)
        for make in (lambda: [x, 1], lambda: [], lambda: (x,)):
            D.assert_same(_call_record(up, make()), _call_record(ours, make()), repr(make()))
        for call in (lambda f: f(args=[x]), lambda f: f(), lambda f: f([x], [x])):
            D.assert_same(_outcome(lambda: call(up)), _outcome(lambda: call(ours)), "arguments")
    compiled.seen = types.SimpleNamespace(append=lambda v: None)
    _leak_check(ours, lambda: [x, x], (x,))


@pytest.mark.needs_c
@pytest.mark.skipif(not CLOSURES, reason="2.12's closures: the release generates a function")
def test_rng_closure_functionalized_stays_upstreams():
    compiled = Recorder(lambda args: list(args))
    meta = types.SimpleNamespace(tokens={}, is_rng_op_functionalized=True)
    before = torch_aot_rt.stats()["fallback_reasons"]
    with torch_aot_rt.enabled(True):
        fn = rw.FunctionalizedRngRuntimeWrapper().post_compile(
            compiled, _aot_config(), runtime_metadata=meta)
    assert type(fn).__name__ == "function" and fn.__code__.co_name == "wrapper"
    after = torch_aot_rt.stats()["fallback_reasons"]
    key = ("functionalized RNG wrapper: FunctionalizedRngRuntimeWrapper.post_compile returns a "
           f"closure on torch {D.RELEASE.name} (functionalized RNG, not mirrored)")
    assert after.get(key, 0) == before.get(key, 0) + 1, after


@needs_synthetic_c
@pytest.mark.needs_c
def test_unverified_shape_falls_back():
    # base_groups keys that upstream's code cannot index: upstream's function
    compiled = Recorder(lambda args: list(args))
    w = _synthetic_wrapper({1: [0]}, [1])()
    before = torch_aot_rt.stats()
    with torch_aot_rt.enabled(True):
        fn = type(w).post_compile(w, compiled, _aot_config(), runtime_metadata=None)
    assert type(fn).__name__ == "function"
    reasons = torch_aot_rt.stats()["fallback_reasons"]
    key = "synthetic base wrapper: base_groups keys are not 0..n-1"
    assert reasons.get(key, 0) == before["fallback_reasons"].get(key, 0) + 1, reasons


@pytest.mark.needs_c
def test_replaced_and_restored():
    for cls in (rw.AOTDedupeWrapper, rw.EffectTokensWrapper, rw.AOTSyntheticBaseWrapper,
                rw.FunctionalizedRngRuntimeWrapper, rw.FakifiedOutWrapper,
                rw.DebugAssertWrapper):
        ours = cls.__dict__["post_compile"]
        assert ours is not _upstream_post_compile(cls)
        assert ours.__wrapped__ is _upstream_post_compile(cls)


# ---------------------------------------------------------------------------
# no Python frame of torch/_functorch/ in a steady-state call


def _is_pytree_thunk_method(frame) -> bool:
    qualname = getattr(frame.f_code, "co_qualname", None)  # CPython 3.11 on
    if qualname is not None:
        return qualname.startswith("PytreeThunk.")
    return type(frame.f_locals.get("self")).__name__ == "PytreeThunk"


def _functorch_frames(call) -> list:
    """The Python functions of AOTAutograd's runtime (torch/_functorch/_aot_autograd/)
    that ``call()`` runs (aot_function's own pytree layer, aot_autograd.py's
    returned_function and its PytreeThunk, is not part of it)."""
    seen = []

    def profile(frame, event, arg):
        path = frame.f_code.co_filename.replace("\\", "/")
        if (event == "call" and "torch/_functorch/_aot_autograd/" in path
                and not _is_pytree_thunk_method(frame)):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("case", ["dedupe", "synthetic_base", "effect_tokens"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_steady_state_runs_no_functorch_frame(case, requires_grad):
    fn, make = {
        "dedupe": (f_dupe_mutated, lambda: (lambda x: (x, x))(_leafish(requires_grad))),
        "synthetic_base": (f_alias_mutated, lambda: _aliased("cpu", requires_grad).args),
        "effect_tokens": (f_print, lambda: (torch.randn(3, requires_grad=requires_grad),)),
    }[case]
    counts = {}
    for use_c in (False, True):
        compiled = aot_function(fn, fw_compiler=D.observing_compiler("fw"),
                                bw_compiler=D.observing_compiler("bw"),
                                keep_inference_input_mutations=True)

        def step():
            out = compiled(*make())
            out = [out] if isinstance(out, torch.Tensor) else list(out)
            if requires_grad:
                # contiguous grads: tangent coercion (a known Python path of the
                # C backward for expanded grads) is not what this test is about
                torch.autograd.backward(out, [torch.ones_like(o) for o in out])

        with D.runtime(use_c):  # aot_function compiles at the first call
            step()
            step()
        counts[use_c] = _functorch_frames(step)
    assert counts[False], "upstream ran no torch/_functorch frame: the test cannot fail"
    if D.C_ENABLED and case == "synthetic_base" and not SYNTHETIC_IN_C:
        # 2.12: the synthetic base closure is upstream's; nothing around it
        assert counts[True][0] == "wrapped_compiled_fn", counts[True]
        assert "merge_view_inputs" in counts[True]
        assert not {"runtime_wrapper", "run", "forward", "backward"} & set(counts[True])
    elif D.C_ENABLED:
        assert counts[True] == [], counts[True]


def _leafish(requires_grad):
    if requires_grad:
        return torch.randn(4, requires_grad=True).clone()
    return torch.randn(4)


# ---------------------------------------------------------------------------
# AOTAutogradCache: a hit runs the wrappers' post_compile again


@pytest.mark.inductor
def test_autograd_cache_hit():
    # (graphs with effect tokens are not saved to the cache: always a miss)
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    fn, make = f_alias_mutated, lambda: _aliased("cpu", False).args

    def step(use_c, expect):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        before = torch_aot_rt.stats()
        args = make()
        with D.runtime(use_c):
            compiled = torch.compile(fn, backend="inductor", fullgraph=True)
            outs = [compiled(*args) for _ in range(2)]
        got = {k: v for k, v in counters["aot_autograd"].items() if "autograd_cache" in k}
        assert got.get(expect) == 1, got
        after = torch_aot_rt.stats()
        if D.C_ENABLED:
            # the synthetic base wrapper (2.13 on); on 2.12 the RNG closure
            # (a hit runs no EffectTokensWrapper), and the synthetic base
            # closure upstream's, counted
            built = 1 if use_c else 0
            assert after["wrappers"] - before["wrappers"] == built, after
            new = {k: v - before["fallback_reasons"].get(k, 0)
                   for k, v in after["fallback_reasons"].items()}
            new = {k: v for k, v in new.items() if v}
            if use_c and not SYNTHETIC_IN_C:
                assert list(new) == [k for k in new if k.startswith(SYNTHETIC_UPSTREAM)], new
                assert sum(new.values()) == 1, new
            else:
                assert new == {}, after
        return [D.TensorValue(t) for o in outs for t in o], [D.TensorValue(a) for a in args]

    with torch._functorch.config.patch(enable_autograd_cache=True), \
            torch._inductor.config.patch(fx_graph_cache=True), fresh_cache():
        ref = step(False, "autograd_cache_miss")
        hit_on = step(True, "autograd_cache_hit")
        hit_off = step(False, "autograd_cache_hit")
    D.assert_same(ref, hit_on, "hit with C")
    D.assert_same(ref, hit_off, "hit without")


# ---------------------------------------------------------------------------
# TORCH_TRACE: the wrappers' generated sources are logged as upstream logs them

_TRACE_PROGRAM = r'''
import torch
import torch_aot_rt  # noqa: F401 (TORCH_AOT_RT decides whether it acts)
from functorch.compile import aot_function, nop

def dupe(a, b):
    a.mul_(2)
    return a + b

def alias(a, b):
    a.mul_(2)
    return a + 1, b * 3

def effect(x):
    torch.ops.aten._print("traced")
    return x + 1

x = torch.randn(4)
aot_function(dupe, nop, keep_inference_input_mutations=True)(x, x)
base = torch.randn(6)
aot_function(alias, nop, keep_inference_input_mutations=True)(base[:4], base[2:])
torch.compile(effect, backend="aot_eager")(torch.randn(3))
'''
_TRACED = ("dedup_wrapper", "synthetic_base_wrapper", "effect_tokens_wrapper")
# the classes whose generated sources those are: a closure (2.12) logs none
_TRACED_CLASSES = ("AOTDedupeWrapper", "AOTSyntheticBaseWrapper", "EffectTokensWrapper")


def _wrapper_sources(trace_dir) -> list:
    """[(name, source)] of the three wrappers' generated sources, in log order:
    their own artifacts (2.13, 2.14) or blocks of 2.15's aggregated one."""
    out = []
    for name, text in read_artifacts(trace_dir, _TRACED + ("aot_autograd_runtime_wrappers",)):
        if name in _TRACED:
            out.append((name, text))
        else:
            out += [(b, t) for b, t in split_blocks(text) if b in _TRACED]
    return out


@pytest.mark.needs_c
@pytest.mark.cpp_independent  # the wrappers' trace sources: none from the C++ part
def test_trace_artifacts_are_upstreams(tmp_path):
    import os
    import subprocess

    from _root import ROOT as root
    found = {}
    for on in (False, True):
        trace_dir = tmp_path / str(on)
        trace_dir.mkdir()
        env = dict(os.environ, TORCH_TRACE=str(trace_dir), TORCH_AOT_RT="1" if on else "0",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, "-c", _TRACE_PROGRAM], env=env, check=True,
                       timeout=600, capture_output=True)
        found[on] = _wrapper_sources(str(trace_dir))
    expected = [n for n, c in zip(_TRACED, _TRACED_CLASSES) if not _closure_here(c)]
    assert [n for n, _ in found[False]] == expected, found[False]
    assert found[True] == found[False]


@pytest.mark.needs_c
def test_reference_cycles_are_collected():
    # each C object traverses what it holds: a cycle through the compiled
    # function it calls is freed by the garbage collector
    import weakref

    from torch_aot_rt import _C

    def make_all(compiled):
        cell = types.CellType
        return [
            _C.DedupeWrapper(compiled, compiled, (0,), (0, 0)),
            _C.EffectTokensWrapper(compiled, compiled, 1),
            _C.SyntheticBaseWrapper(compiled, compiled, torch, ((0, 1),), (2,), (0,)),
            _C.RngWrapper(compiled, compiled, compiled, compiled, compiled, 0, True),
            _C.FakifiedOutWrapper(compiled, cell(compiled), cell(None)),
            _C.DebugAssertWrapper(compiled, compiled, torch.Tensor, ((0, True, "m"),)),
            _C.ForwardingWrapper(compiled, compiled),
        ]

    for k in range(7):
        compiled = Recorder(lambda args: args)
        ours = make_all(compiled)[k]
        compiled.back = ours  # the cycle
        ref = weakref.ref(ours)
        del ours, compiled
        gc.collect()
        assert ref() is None, k
