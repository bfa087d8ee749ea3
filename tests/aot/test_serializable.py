"""``SerializableCompiledFunction`` with the C ``__call__`` (``_C.SerializableCall``,
``torch_aot_rt/_serializable_call.py``), C runtime off vs on.

Instances created with the C path on are of our subclass; everything a caller
can see of one is upstream's: the call (positional and keyword arguments,
results, exceptions), ``isinstance``, ``serialize()``, the attributes
``update_wrapper`` copies, the name of its type. (AOTAutogradCache hits, where
AOTAutograd creates them, are in test_autograd_function.py's cache test.)
"""

from __future__ import annotations

import pytest
import torch._functorch._aot_autograd.runtime_wrappers as rw

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c


def compiled(*args, **kwargs):
    """The wrapped function: its docstring is copied onto the wrapper."""
    if kwargs.get("fail"):
        raise ValueError(f"failed with {args!r}")
    return ("called", args, tuple(sorted(kwargs.items())))


def observe(use_c):
    before = torch_aot_rt.stats()["serializable_functions"]
    with D.runtime(use_c):
        fn = rw.SerializableCompiledFunction(compiled, lambda: "entry")
    built = torch_aot_rt.stats()["serializable_functions"] - before
    seen = {
        "isinstance": isinstance(fn, rw.SerializableCompiledFunction),
        "type_name": (type(fn).__name__, type(fn).__module__, type(fn).__qualname__),
        "serialize": fn.serialize(),
        "doc": fn.__doc__,
        "compiled_fn": fn.compiled_fn is compiled,
        "calls": [fn(), fn(1, 2), fn([3], key="v"), fn(*range(20), **{"a": 1, "b": 2})],
        "error": D.error_record(D.raised(lambda: fn(1, fail=True))),
        "callable": callable(fn),
    }
    fn.compiled_fn = lambda *a: ("replaced", a)  # read per call, as upstream
    seen["after_replace"] = fn(5)
    return seen, built, type(fn)


def test_same_as_upstream():
    off, built_off, type_off = observe(False)
    on, built_on, type_on = observe(True)
    assert built_off == 0 and type_off is rw.SerializableCompiledFunction
    assert built_on == 1 and type_on is not rw.SerializableCompiledFunction
    assert isinstance(type_on.__dict__["__call__"], torch_aot_rt._C.SerializableCall)
    D.assert_same(off, on, "serializable")


def test_subclass_instances_untouched():
    class Mine(rw.SerializableCompiledFunction):
        pass

    with D.runtime(True):
        fn = Mine(compiled, lambda: None)
    assert type(fn) is Mine
    assert fn(1) == compiled(1)


def test_c_call_needs_self():
    with pytest.raises(TypeError):
        torch_aot_rt._C.SerializableCall()()
    with pytest.raises(TypeError):
        torch_aot_rt._C.SerializableCall(1)
