"""What the compiler-wrapper tests share: which wrappers the installed torch
builds as closures, the C-or-upstream expectations that follow, the direct
builders of a wrapper pair, and the leak check.
"""

from __future__ import annotations

import gc
import re
import sys
import types

import pytest
import torch

import _differential as D
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
