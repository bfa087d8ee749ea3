"""The other per-call compiler wrappers of ``runtime_wrappers.py`` in C
(``torch_aot_rt/_wrappers.py``, ``csrc/aot/*_wrapper.c``), C off vs on.

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
"""

from __future__ import annotations

import gc
import re
import sys
import types
from unittest import mock

import pytest
import torch
import torch._functorch._aot_autograd.runtime_wrappers as rw
from functorch.compile import aot_function

import _differential as D
from _trace_log import read_artifacts, split_blocks
import torch_aot_rt

# ---------------------------------------------------------------------------
# helpers


def _wrapper_types():
    from torch_aot_rt import _C

    return (_C.DedupeWrapper, _C.EffectTokensWrapper, _C.SyntheticBaseWrapper,
            _C.RngWrapper, _C.FakifiedOutWrapper, _C.DebugAssertWrapper, _C.ForwardingWrapper)


def _closure_here(cls_name: str) -> bool:
    """This release's ``cls_name.post_compile`` returns a reference closure (2.12)."""
    return D.RELEASE is not None and cls_name in D.RELEASE.closure_compiler_wrappers


# 2.12: the synthetic base closure (merge_view_inputs per call) stays
# upstream's, counted; its C object is built on 2.13 on only
SYNTHETIC_IN_C = not _closure_here("AOTSyntheticBaseWrapper")
SYNTHETIC_UPSTREAM = ("synthetic base wrapper: AOTSyntheticBaseWrapper.post_compile returns a "
                      "closure")
# 2.12: the effect-tokens and RNG closures wrap every compiled function; C
# objects from their cells (_C.ForwardingWrapper where they only pass the
# call on), functionalized RNG upstream's
SYNTHETIC_ALLOW = None if SYNTHETIC_IN_C else SYNTHETIC_UPSTREAM
CLOSURES = _closure_here("EffectTokensWrapper")
needs_synthetic_c = pytest.mark.skipif(
    not SYNTHETIC_IN_C, reason="the release's synthetic base closure stays upstream's "
    "(the end-to-end tests check that it does, counted)")
needs_generated_rng = pytest.mark.skipif(
    CLOSURES, reason="functionalized RNG stays upstream's on this release "
    "(test_rng_closure_functionalized_stays_upstreams)")


def _forwarding_wrappers(on) -> int:
    """The C wrappers every compile of ``on`` builds whatever it needs: 2.12's
    effect-tokens and RNG closures, each a _C.ForwardingWrapper here."""
    return 2 * len(on.wrappers) if CLOSURES else 0


def _check_synthetic_base(on):
    """The synthetic base wrapper of ``on`` (a C-path run) is C, or this
    release's upstream closure, counted."""
    if not D.C_ENABLED:
        return
    if SYNTHETIC_IN_C:
        assert on.built("wrappers") >= 1, on.stats_after
        assert not on.new_fallback_reasons(), on.new_fallback_reasons()
    else:
        assert any(k.startswith(SYNTHETIC_UPSTREAM) for k in on.new_fallback_reasons()), \
            on.stats_after


def _upstream_post_compile(cls):
    """Upstream's ``cls.post_compile`` (ours replaced it when the C path is on)."""
    if not D.C_ENABLED:
        return cls.post_compile
    for record in D._state.installed["replaced"]:
        if record.owner is cls and record.name == "post_compile":
            return record.upstream
    raise AssertionError(f"{cls.__name__}.post_compile was not replaced")


def _build_pair(wrapper_factory, compiled_fn, aot_config, meta):
    """(upstream's function, ours) from two equal wrappers and the same inputs."""
    cls = type(wrapper_factory())
    up = _upstream_post_compile(cls)(wrapper_factory(), compiled_fn, aot_config,
                                     runtime_metadata=meta)
    before = torch_aot_rt.stats()
    with torch_aot_rt.enabled(True):
        ours = cls.post_compile(wrapper_factory(), compiled_fn, aot_config, runtime_metadata=meta)
    if D.C_ENABLED:
        after = torch_aot_rt.stats()
        assert isinstance(ours, _wrapper_types()), type(ours)
        assert after["wrappers"] == before["wrappers"] + 1
        assert after["fallbacks"] == before["fallbacks"], D._state.counters()
    return up, ours


class Recorder:
    """A boxed compiled function: records the list it got (and whether it
    was cleared by the caller afterwards), returns ``result(args)``."""

    _boxed_call = True

    def __init__(self, result):
        self.result = result
        self.seen = []

    def __call__(self, args):
        self.seen.append((type(args).__name__, list(args)))
        return self.result(args)


def _aot_config(num_params=0):
    return types.SimpleNamespace(aot_id=7, num_params_buffers=num_params,
                                 is_export=False, aot_autograd_arg_pos_to_source=None)


def _identity_of(fn) -> dict:
    return {
        "name": fn.__name__,
        "qualname": fn.__qualname__,
        "module": fn.__module__,
        "doc": fn.__doc__,
        "boxed": getattr(fn, "_boxed_call", None),
        "wrapped": getattr(fn, "__wrapped__", None) is not None,
        "keys": sorted(k for k in vars(fn) if not k.startswith("__")),
    }


def _call_record(fn, args):
    """Call fn(args); what came back or was raised, and the list afterwards."""
    try:
        out = fn(args)
    except Exception as e:  # noqa: BLE001
        out = D.error_record(e)
    return {"out": _ids(out), "args_after": _ids(args)}


def _raise(args):
    raise RuntimeError("the compiled graph raised")


def _ids(x):
    """Objects named by identity (stable across the two runs' shared objects)."""
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [_ids(v) for v in x]]
    if isinstance(x, torch.Tensor):
        return ("tensor", id(x), tuple(x.shape), x.stride(), x.storage_offset())
    return x if x is None or isinstance(x, (int, float, str, dict)) else repr(type(x))


def _leak_check(fn, make_args, watch=(), n=200):
    """No reference to the arguments (``watch``: the objects they hold), or to
    anything else, is kept per call, whether the call returns or raises."""
    def call():
        try:
            fn(make_args())
        except Exception:  # noqa: BLE001 - error paths must not leak either
            pass

    for _ in range(5):
        call()
    gc.collect()
    rcs = [sys.getrefcount(w) for w in watch]
    total0 = sys.gettotalrefcount() if hasattr(sys, "gettotalrefcount") else None
    objs0 = len(gc.get_objects())
    for _ in range(n):
        call()
    gc.collect()
    assert [sys.getrefcount(w) for w in watch] == rcs
    if total0 is not None:
        assert sys.gettotalrefcount() - total0 < n
    assert len(gc.get_objects()) - objs0 < n // 4, len(gc.get_objects()) - objs0


def _same_but_graph_ids(off, on):
    """compare_runs, the two runs' AOT graph ids (in guard-bug messages) aside."""
    for run in (off, on):
        for call in run.calls:
            if call["error"] is not None:
                call["error"]["message"] = re.sub(r"graph \d+", "graph N",
                                                  call["error"]["message"])
    D.compare_runs(off, on)


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
# direct: each C object against upstream's function, same wrapper and metadata


def _dedupe_wrapper():
    return rw.AOTDedupeWrapper(keep_arg_mask=[True, False, True, False],
                               add_dupe_map=[0, 0, 1, 1], needs_post_compile=True)


@pytest.mark.needs_c
def test_dedupe_direct():
    compiled = Recorder(lambda args: [a for a in args])
    up, ours = _build_pair(_dedupe_wrapper, compiled, _aot_config(1), None)
    assert _identity_of(up) == _identity_of(ours)
    x, y = torch.randn(2), torch.randn(3)
    p = torch.nn.Parameter(torch.randn(2))
    cases = [
        lambda: [x, x, y, y],                       # the plain call
        lambda: [x, y, y, y],                       # guard bug at position 1
        lambda: [x, x, y, x],                       # ... at position 3
        lambda: [x, x, y],                          # short: upstream's IndexError
        lambda: [x, x, y, y, 5],                    # long: the extra argument dropped
        lambda: (x, x, y, y),                       # a tuple: upstream's AttributeError
        lambda: [1, 1, 2.5, 2.5],                   # numbers: the same objects
        lambda: [p, p, y, y],
        lambda: [p, None, y, y],
    ]
    for k, make in enumerate(cases):
        ra, rb = _call_record(up, make()), _call_record(ours, make())
        D.assert_same(ra, rb, f"case {k}")
    # keywords (upstream's function runs) and arity (its TypeErrors)
    for call in (lambda f: f(args=[x, x, y, y]), lambda f: f(), lambda f: f([x], [y])):
        D.assert_same(_outcome(lambda: call(up)), _outcome(lambda: call(ours)), "arguments")


def _outcome(f):
    try:
        return {"out": _ids(f())}
    except Exception as e:  # noqa: BLE001
        return D.error_record(e)


@pytest.mark.needs_c
def test_dedupe_direct_messages():
    compiled = Recorder(lambda args: list(args))
    up, ours = _build_pair(_dedupe_wrapper, compiled, _aot_config(1), None)
    x, y = torch.randn(2), torch.randn(2)
    for args in ([x, y, y, y], [x, x, y, x]):
        e_up = D.raised(lambda: up(list(args)))
        e_ours = D.raised(lambda: ours(list(args)))
        assert type(e_up) is type(e_ours) is AssertionError
        assert str(e_up) == str(e_ours)
        assert "parameter/buffer 0" in str(e_up) or "input 0" in str(e_up), str(e_up)
    assert compiled.seen == []  # neither called the graph


@pytest.mark.needs_c
def test_dedupe_direct_plain_and_leaks():
    out = [torch.randn(1)]
    compiled = Recorder(lambda args: out)
    _, ours = _build_pair(_dedupe_wrapper, compiled, _aot_config(), None)
    x, y = torch.randn(2), torch.randn(3)
    args = [x, x, y, y]
    assert ours(args) is out
    assert args == []
    assert compiled.seen[-1][0] == "list" and compiled.seen[-1][1][0] is x
    assert compiled.seen[-1][1][1] is y and len(compiled.seen[-1][1]) == 2
    compiled.seen.clear()
    compiled.result = lambda args: None
    compiled.seen = types.SimpleNamespace(append=lambda v: None)
    _leak_check(ours, lambda: [x, x, y, y], (x, y))
    _leak_check(ours, lambda: [x, y, y, y], (x, y))  # upstream's AssertionError
    compiled.result = _raise
    _leak_check(ours, lambda: [x, x, y, y], (x, y))  # the graph raises


def _tokens_pair(n, result):
    compiled = Recorder(result)
    meta = types.SimpleNamespace(tokens={i: None for i in range(n)})
    up, ours = _build_pair(rw.EffectTokensWrapper, compiled, _aot_config(), meta)
    return up, ours, compiled


@pytest.mark.needs_c
@pytest.mark.parametrize("result", ["list", "tuple", "none", "int"])
def test_effect_tokens_direct(result):
    x = torch.randn(2)
    make_out = {
        "list": lambda args: [None, None, x, 3],
        "tuple": lambda args: (None, None, x),
        "none": lambda args: None,
        "int": lambda args: 5,  # not subscriptable: upstream's TypeError
    }[result]
    up, ours, compiled = _tokens_pair(2, make_out)
    assert _identity_of(up) == _identity_of(ours)
    for make in (lambda: [x, 1], lambda: [], lambda: (x,), lambda: "ab"):
        a, b = make(), make()
        ra, rb = _call_record(up, a), _call_record(ours, b)
        D.assert_same(ra, rb, f"{result} {make()!r}")
    assert compiled.seen[0] == ("list", [None, None, x, 1])
    for call in (lambda f: f(args=[x]), lambda f: f(), lambda f: f([x], [x])):
        D.assert_same(_outcome(lambda: call(up)), _outcome(lambda: call(ours)), "arguments")


@pytest.mark.needs_c
def test_effect_tokens_direct_leaks():
    x = torch.randn(2)
    _, ours, compiled = _tokens_pair(1, lambda args: [None, x])
    compiled.seen = types.SimpleNamespace(append=lambda v: None)
    _leak_check(ours, lambda: [x, x], (x,))
    compiled.result = _raise
    _leak_check(ours, lambda: [x, x], (x,))


def _synthetic_wrapper(groups, other, meta_mut=()):
    def make():
        w = rw.AOTSyntheticBaseWrapper(trace_joint=False)
        for k, g in groups.items():
            w.base_groups[k] = list(g)
        w.other_arg_indices = list(other)
        w.aliased_arg_idx_with_metadata_mutations = list(meta_mut)
        w.needs_post_compile = True
        return w

    return make


class BaseSpy(torch.Tensor):
    """A tensor subclass whose ``_base`` reads are counted (through
    ``__torch_function__``), so that both runs must read it equally often."""

    reads: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor._base.__get__:
            cls.reads.append(id(args[0]))
        return super().__torch_function__(func, types, args, kwargs or {})


@needs_synthetic_c
@pytest.mark.needs_c
@pytest.mark.parametrize("shape", ["single", "group", "no_base", "meta_mut", "short"])
def test_synthetic_base_direct(shape):
    def run(fn):
        torch.manual_seed(0)
        root = torch.randn(8)
        v1, v2 = root[:4], root[4:]
        plain = torch.randn(3)
        if shape == "single":
            args = [v1, plain]
        elif shape == "group":
            args = [plain.clone(), v1, v2, plain]
        elif shape == "no_base":
            args = [root, plain]
        elif shape == "meta_mut":
            args = [v1, plain, v2]
        else:
            args = [v1]
        rec = {"args": [tuple(a.shape) for a in args]}
        try:
            out = fn(args)
            rec["out"] = _describe(out, root)
        except Exception as e:  # noqa: BLE001
            rec["error"] = D.error_record(e)
        rec["args_after"] = len(args)
        rec["seen"] = [[_describe(a, root) for a in s[1]] for s in compiled.seen]
        rec["root_after"] = D.TensorValue(root)
        if shape == "meta_mut":
            rec["v1"] = (tuple(v1.shape), v1.stride(), v1.storage_offset())
        compiled.seen.clear()
        return rec

    def result(args):
        if shape == "meta_mut":
            return [args[0] * 1, args[0][:2]]  # the user out, then the mutated input
        return [args[0] + 1]

    compiled = Recorder(result)
    groups, other, meta_mut = {
        "single": ({0: [0]}, [1], ()),
        "group": ({0: [1, 2]}, [0, 3], ()),
        "no_base": ({0: [0]}, [1], ()),
        "meta_mut": ({0: [0, 2]}, [1], (0,)),
        "short": ({0: [0]}, [1], ()),
    }[shape]
    up, ours = _build_pair(_synthetic_wrapper(groups, other, meta_mut), compiled,
                           _aot_config(), None)
    assert _identity_of(up) == _identity_of(ours)
    D.assert_same(run(up), run(ours), shape)


def _describe(x, root):
    if isinstance(x, torch.Tensor):
        return {"shape": tuple(x.shape), "stride": x.stride(), "offset": x.storage_offset(),
                "is_root": x is root,
                "shares_root": x.untyped_storage().data_ptr() == root.untyped_storage().data_ptr(),
                "value": D.TensorValue(x)}
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [_describe(v, root) for v in x]]
    return repr(x)


@needs_synthetic_c
@pytest.mark.needs_c
def test_synthetic_base_direct_base_reads():
    compiled = Recorder(lambda args: [args[0]])
    up, ours = _build_pair(_synthetic_wrapper({0: [0, 1]}, [2]), compiled, _aot_config(), None)

    def reads(fn):
        root = torch.randn(8).as_subclass(BaseSpy)
        a, b = root[:4], root[4:]
        BaseSpy.reads = []
        fn([a, b, torch.randn(1)])
        return [("a" if r == id(a) else "b" if r == id(b) else "?") for r in BaseSpy.reads]

    assert reads(up) == reads(ours) == ["a", "a", "a"]  # any(), then next()'s if and value


@needs_synthetic_c
@pytest.mark.needs_c
def test_synthetic_base_direct_leaks():
    compiled = Recorder(lambda args: [args[0]])
    _, ours = _build_pair(_synthetic_wrapper({0: [0, 1]}, [2], ()), compiled, _aot_config(),
                          None)
    root = torch.randn(8)
    compiled.seen = types.SimpleNamespace(append=lambda v: None)
    _leak_check(ours, lambda: [root[:4], root[4:], 1], (root,))
    _leak_check(ours, lambda: [torch.randn(3), torch.randn(3), 1])  # storage bases
    compiled.result = _raise
    _leak_check(ours, lambda: [root[:4], root[4:], 1], (root,))
    _, ours = _build_pair(_synthetic_wrapper({0: [0, 1]}, [2], (0,)), compiled, _aot_config(),
                          None)
    compiled.result = lambda args: [args[0] * 2, args[0][:2]]
    _leak_check(ours, lambda: [root[:4], root[4:], 1], (root,))  # metadata mutation


# ---------------------------------------------------------------------------
# direct: functionalized RNG (CUDA only end to end: stand-ins for its helpers)


class _FakeRng:
    def __init__(self, state):
        self.state = state
        self.offsets = []

    def get(self, fake_mode=None):
        return self.state

    def set(self, offset):
        self.offsets.append(offset)


@needs_generated_rng
@pytest.mark.needs_c
@pytest.mark.parametrize("return_new_outs", [True, False])
@pytest.mark.parametrize("state", ["tuple", "list", "gen", "three"])
def test_rng_direct(return_new_outs, state):
    seed, offset = torch.tensor(1), torch.tensor(2)
    states = {
        "tuple": (seed, offset),
        "list": [seed, offset],
        "gen": None,  # a generator each time: unpacked by Python
        "three": (seed, offset, seed),  # upstream's ValueError
    }

    def make_state():
        if state == "gen":
            return (t for t in (seed, offset))
        return states[state]

    fake = _FakeRng(None)
    fake.get = lambda fake_mode=None: make_state()
    meta = types.SimpleNamespace(is_rng_op_functionalized=True, num_outputs_rng_offset=1,
                                 num_forward_returns=2)
    helper = rw.CUDARngStateHelper
    with mock.patch.object(helper, "get_torch_state_as_tuple", staticmethod(fake.get)), \
            mock.patch.object(helper, "set_new_offset", staticmethod(fake.set)):
        new_offset = torch.tensor(9)
        compiled = Recorder(lambda args: ["o0", "o1", new_offset, "o3"])
        up, ours = _build_pair(
            lambda: rw.FunctionalizedRngRuntimeWrapper(return_new_outs=return_new_outs),
            compiled, _aot_config(), meta)
    assert _identity_of(up) == _identity_of(ours)
    recs = []
    for fn in (up, ours):
        args = ["a"]
        fake.offsets.clear()
        compiled.seen.clear()
        rec = _call_record(fn, args)
        rec["offsets"] = [int(o) for o in fake.offsets]
        rec["seen"] = [[_ids(v) for v in s[1]] for s in compiled.seen]
        recs.append(rec)
    D.assert_same(recs[0], recs[1], state)


@needs_generated_rng
@pytest.mark.needs_c
def test_rng_direct_leaks():
    meta = types.SimpleNamespace(is_rng_op_functionalized=True, num_outputs_rng_offset=1,
                                 num_forward_returns=1)
    seed, offset = torch.tensor(1), torch.tensor(2)
    helper = rw.CUDARngStateHelper
    with mock.patch.object(helper, "get_torch_state_as_tuple",
                           staticmethod(lambda fake_mode=None: (seed, offset))), \
            mock.patch.object(helper, "set_new_offset", staticmethod(lambda o: None)):
        compiled = Recorder(lambda args: [args[0], offset, args[0]])
        compiled.seen = types.SimpleNamespace(append=lambda v: None)
        _, ours = _build_pair(lambda: rw.FunctionalizedRngRuntimeWrapper(), compiled,
                              _aot_config(), meta)
    x = torch.randn(2)
    _leak_check(ours, lambda: [x], (x, seed, offset))


# ---------------------------------------------------------------------------
# direct: fakified outputs (inductor's fakify_first_call)


@pytest.mark.needs_c
def test_fakified_out_direct():
    metas = [torch.empty(2, 3), 4]

    def make():
        return rw.FakifiedOutWrapper(out_metas=list(metas), fwd_output_strides=[[1, 2], None],
                                     needs_post_compile=True)

    compiled = Recorder(lambda args: ["real"])
    up, ours = _build_pair(make, compiled, _aot_config(), None)
    assert _identity_of(up) == _identity_of(ours)
    recs = []
    for fn in (up, ours):
        first = fn([1])
        recs.append({
            "first": [(tuple(t.shape), t.stride()) if isinstance(t, torch.Tensor) else t
                      for t in first],
            "second": fn([2]),
            "third": fn(runtime_args=[3]),  # a keyword: upstream's closure, same cells
            "arity": D.error_record(D.raised(lambda: fn())),
        })
    D.assert_same(recs[0], recs[1], "fakified")


# ---------------------------------------------------------------------------
# direct: debug asserts


@pytest.mark.needs_c
def test_debug_assert_direct():
    def make():
        return rw.DebugAssertWrapper(flat_requires_grad=[True, False, None, False])

    compiled = Recorder(lambda args: ["out"])
    up, ours = _build_pair(make, compiled, _aot_config(1), None)
    assert _identity_of(up) == _identity_of(ours)
    g = torch.randn(2, requires_grad=True)
    p = torch.randn(2)
    cases = [
        [g, p, 3, p],        # passes
        [g, g, 3, p],        # arg 1 requires grad
        [g, p, p, p],        # arg 2 is a tensor
        [g, p, 3, g],        # arg 3 requires grad
        [g, p, 3],           # short: upstream's IndexError (2.11: checks fewer)
        [g, p, 3, p, g],     # long: passes (2.11: flat_requires_grad[4]'s IndexError)
        (g, p, 3, p),        # a tuple: upstream's function
    ]
    for k, args in enumerate(cases):
        ra = _call_record(up, args if isinstance(args, tuple) else list(args))
        rb = _call_record(ours, args if isinstance(args, tuple) else list(args))
        D.assert_same(ra, rb, f"case {k}")


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
