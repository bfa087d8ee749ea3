"""Each C compiler wrapper of ``csrc/aot/wrappers/*_wrapper.c`` built directly by our
``post_compile`` from the same wrapper and metadata as upstream's, both called
alike: results, the argument list afterwards, errors and their messages, the
calls that are not the plain case, and reference counts over many calls; the
functionalized-RNG and fakified-output wrappers with stand-ins for what they
call (see test_wrappers.py).
"""

from __future__ import annotations

import types
from unittest import mock

import pytest
import torch
import torch._functorch._aot_autograd.runtime_wrappers as rw

import _differential as D

from _wrapper_cases import (
    Recorder, _aot_config, _build_pair, _call_record, _identity_of, _ids, _leak_check, _raise,
    needs_generated_rng, needs_synthetic_c,
)


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
