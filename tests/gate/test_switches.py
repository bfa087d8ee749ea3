"""The switches and counters: ``enable``/``disable``/``enabled``, ``stats``,
``reset_stats``, the ``TORCH_AOT_RT`` environment switch (in subprocesses),
and the attributes of the wrapper object itself.
"""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
import types

import pytest
import torch
import torch._functorch._aot_autograd.runtime_wrappers as rw
from functorch.compile import aot_function, nop

import _differential as D
import _fresh_python as fresh_python
import torch_aot_rt
from _cases import f_plain

from _root import ROOT  # noqa: E402


def f_mut_alias(a):
    a.mul_(2)
    return a.view(-1), a + 1


def _compile_and_call(fn=f_plain, requires_grad=False):
    """One aot_function compile; returns the runtime wrapper(s) built."""
    with D.WrapperSpy() as spy:
        g = aot_function(fn, fw_compiler=nop, bw_compiler=nop)
        g(torch.randn(3, requires_grad=requires_grad), torch.randn(3))
    return [r["result"] for r in spy.records]


@pytest.mark.needs_c
def test_stats_count_each_compile():
    torch_aot_rt.enable()
    before = torch_aot_rt.stats()
    for rg in (False, True, False):
        (w,) = _compile_and_call(requires_grad=rg)
        assert isinstance(w, D.RuntimeWrapperType)
    after = torch_aot_rt.stats()
    assert after["runtime_wrappers"] == before["runtime_wrappers"] + 3
    assert after["autograd_functions"] == before["autograd_functions"] + 1
    assert after["fallbacks"] == before["fallbacks"]


@pytest.mark.needs_c
def test_disable_and_enable():
    try:
        torch_aot_rt.disable()
        assert not torch_aot_rt.is_enabled()
        before = torch_aot_rt.stats()
        (w,) = _compile_and_call()
        assert isinstance(w, types.FunctionType), type(w)
        assert torch_aot_rt.stats() == before
    finally:
        torch_aot_rt.enable()
    assert torch_aot_rt.is_enabled()
    (w,) = _compile_and_call()
    assert isinstance(w, D.RuntimeWrapperType)


@pytest.mark.needs_c
def test_enabled_context_nests_and_restores():
    assert torch_aot_rt.is_enabled()
    with torch_aot_rt.enabled(False):
        assert not torch_aot_rt.is_enabled()
        assert isinstance(_compile_and_call()[0], types.FunctionType)
        with torch_aot_rt.enabled(True):
            assert isinstance(_compile_and_call()[0], D.RuntimeWrapperType)
        assert not torch_aot_rt.is_enabled()
        with pytest.raises(KeyError):
            with torch_aot_rt.enabled(True):
                raise KeyError("restored on error too")
        assert not torch_aot_rt.is_enabled()
    assert torch_aot_rt.is_enabled()


@pytest.mark.needs_c
def test_compiled_functions_keep_their_runtime():
    """The choice is made when the wrapper is built, not per call."""
    with torch_aot_rt.enabled(True):
        with D.WrapperSpy() as spy_c:
            g_c = aot_function(f_plain, fw_compiler=nop, bw_compiler=nop)
            g_c(torch.randn(3), torch.randn(3))
    with torch_aot_rt.enabled(False):
        with D.WrapperSpy() as spy_up:
            g_up = aot_function(f_plain, fw_compiler=nop, bw_compiler=nop)
            g_up(torch.randn(3), torch.randn(3))
    x, y = torch.randn(3), torch.randn(3)
    with torch_aot_rt.enabled(False):
        out_c = g_c(x, y)  # still the C wrapper
    with torch_aot_rt.enabled(True):
        out_up = g_up(x, y)  # still upstream's
    assert isinstance(spy_c.records[0]["result"], D.RuntimeWrapperType)
    assert isinstance(spy_up.records[0]["result"], types.FunctionType)
    assert torch.equal(out_c, out_up)


@pytest.mark.needs_c
def test_stats_snapshot_and_reset():
    _compile_and_call()
    snap = torch_aot_rt.stats()
    assert snap["runtime_wrappers"] >= 1
    snap["runtime_wrappers"] = -5
    snap["fallback_reasons"]["x"] = 1
    assert torch_aot_rt.stats()["runtime_wrappers"] >= 1
    assert "x" not in torch_aot_rt.stats()["fallback_reasons"]
    snap["torch"]["release"] = "x"
    assert torch_aot_rt.stats()["torch"]["release"] != "x"
    torch_aot_rt.reset_stats()
    # the counters reset; "torch" (what the gate decided at install) does not
    expected_torch = dict(version=str(torch.__version__), unverified_opt_in=False, inactive=None)
    expected_torch["release"] = "%d.%d" % tuple(int(p) for p in torch.__version__.split(".")[:2])
    assert torch_aot_rt.stats() == {
        "runtime_wrappers": 0,
        "autograd_functions": 0,
        "guards": 0,
        "serializable_functions": 0,
        "params_prepends": 0,
        "wrappers": 0,
        "subclass_wrappers": 0,
        "fallbacks": 0,
        "fallback_reasons": {},
        "torch": expected_torch,
        "python": {"version": "%d.%d.%d" % sys.version_info[:3], "build": "default"},
        "cpp": torch_aot_rt.stats()["cpp"],  # not a counter either (test_cpp.py checks it)
        "cpp_node": {k: 0 for k in torch_aot_rt.stats()["cpp_node"]},
        "cpp_epilogue": {k: 0 for k in torch_aot_rt.stats()["cpp_epilogue"]},
        # its "unavailable" is what install decided, not a counter
        "dynamo_disable": {
            k: (None if k == "unavailable" else 0)
            for k in torch_aot_rt.stats()["dynamo_disable"]
        },
        "dynamo_bytecode_helpers": {k: 0 for k in torch_aot_rt.stats()["dynamo_bytecode_helpers"]},
        "inductor_graph_call": {k: 0 for k in torch_aot_rt.stats()["inductor_graph_call"]},
        "dynamo_compile_wrapper": {k: 0 for k in torch_aot_rt.stats()["dynamo_compile_wrapper"]},
        "config_reads": {"in C": 0, "upstream's": 0},
    }
    assert "taken" in torch_aot_rt.stats()["cpp_node"]
    assert "taken" in torch_aot_rt.stats()["cpp_epilogue"]
    _compile_and_call()
    assert torch_aot_rt.stats()["runtime_wrappers"] == 1


@pytest.mark.needs_c
@pytest.mark.parametrize("requires_grad", [False, True])
def test_wrapper_looks_like_upstreams(requires_grad):
    """What callers can read off the wrapper: ``_boxed_call``, the graph
    module attributes ``functools.wraps`` copies, ``__doc__``, the signature,
    the name, and binding as a method."""
    compiled_fn, kwargs = D.capture_wrapper_kwargs(
        f_mut_alias, [torch.randn(3, 4, requires_grad=requires_grad).clone()]
    )
    up, ours = D.build_pair(compiled_fn, kwargs)
    assert ours._boxed_call is up._boxed_call is True
    public = lambda w: sorted(k for k in vars(w) if not k.startswith("__"))  # noqa: E731
    assert public(ours) == public(up)
    assert ours.__doc__ == up.__doc__
    # In training on 2.14 both wrap CompiledFunction.apply, which is the builtin
    # _FunctionBase.apply there: inspect.signature raises the same ValueError.
    assert _signature(ours) == _signature(up)
    assert callable(ours.__get__(object()))


def _signature(fn):
    try:
        return str(inspect.signature(fn))
    except ValueError as e:
        return ("ValueError", str(e).split(" at 0x")[0])


@pytest.mark.needs_c
def test_wrapper_name_like_upstreams():
    """``__name__``/``__qualname__``: upstream's wrapper is a function named
    ``runtime_wrapper``; code that logs or wraps compiled functions reads
    these."""
    compiled_fn, kwargs = D.capture_wrapper_kwargs(f_mut_alias, [torch.randn(3, 4)])
    up, ours = D.build_pair(compiled_fn, kwargs)
    assert getattr(ours, "__name__", None) == up.__name__
    assert getattr(ours, "__qualname__", None) == up.__qualname__


def _run_python(code: str, env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("TORCH_AOT_RT", None)
    if env_value is not None:
        env["TORCH_AOT_RT"] = env_value
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    res = fresh_python.run(textwrap.dedent(code), env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]


# Each subprocess imports torch afresh (about 10 s here): few of them.
_PROBE = """
    import torch, torch._dynamo
    import torch._functorch._aot_autograd.runtime_wrappers as rw
    original = rw._create_runtime_wrapper
    original_post = rw.AOTDispatchAutograd.post_compile
    import torch_aot_rt
    from torch_aot_rt import _install
    from functorch.compile import aot_function, nop
    out = aot_function(lambda a: a.view(-1), nop, nop)(torch.randn(2, 2))
    after_import = (
        rw._create_runtime_wrapper is original,
        rw.AOTDispatchAutograd.post_compile is original_post,
        torch_aot_rt.is_enabled(),
        torch_aot_rt.stats()["runtime_wrappers"],
    )
    _install.uninstall()
    after_uninstall = (
        rw._create_runtime_wrapper is original,
        rw.AOTDispatchAutograd.post_compile is original_post,
    )
    try:
        torch_aot_rt.enable()
        after_enable = rw._create_runtime_wrapper is original
    except ImportError:
        after_enable = "no extension"
    print(after_import, after_uninstall, after_enable)
"""


@pytest.mark.cpp_independent
def test_env_switch_off_changes_nothing():
    """TORCH_AOT_RT=0: the import patches nothing and builds nothing; an
    explicit enable() still installs the C runtime (if the extension is
    built)."""
    out = _run_python(_PROBE, "0")
    head = "(True, True, False, 0) (True, True)"
    assert out in (f"{head} False", f"{head} no extension"), out
    if D.C_ENABLED:
        assert out == f"{head} False"


@pytest.mark.needs_c
@pytest.mark.cpp_independent
def test_env_switch_on_installs():
    """No TORCH_AOT_RT: the import installs the C runtime for both the runtime
    wrapper and CompiledFunction; uninstall() puts upstream's back."""
    out = _run_python(_PROBE, None)
    assert out == "(False, False, True, 1) (True, True) False", out


def test_upstream_wrapper_untouched_by_spy():
    """The harness's own spy leaves the builder as it found it."""
    before = rw._create_runtime_wrapper
    with D.WrapperSpy():
        _compile_and_call()
    assert rw._create_runtime_wrapper is before
