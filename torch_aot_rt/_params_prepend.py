"""``aot_module_simplified``'s ``forward`` in C (``_C.ParamsPrepend``,
csrc/aot/autograd/params_prepend.c).

``aot_module_simplified`` (torch/_functorch/aot_autograd.py) returns a
closure that prepends the parameters and buffers to every call's arguments.
It makes that closure with ``simple_wraps(compiled_fn)``, a global of its
module looked up at each compile: ours is upstream's, except that when the
function it decorates is that closure (one of the two code objects
``aot_module_simplified`` holds, checked against what the C version mirrors),
and the C path is on, it returns a ``ParamsPrepend`` over the closure's cells,
with the attributes the closure would carry. Anything else gets upstream's
result; a ``forward`` of ``aot_module_simplified`` that is not the verified
closure is counted.
"""

from __future__ import annotations

import functools
import inspect
import types

_FREEVARS = ("compiled_fn", "params_buffers_flat")
_QUALNAME = "aot_module_simplified.<locals>.forward"
# the function attributes simple_wraps and Python give the closure
_ATTRIBUTES = ("__name__", "__qualname__", "__module__", "__doc__", "__annotations__")


def _is_verified(code: types.CodeType, boxed: bool) -> bool:
    """The closure ParamsPrepend mirrors: ``forward(runtime_args)`` (boxed, a
    GmWrapper) or ``forward(*runtime_args)``."""
    if code.co_freevars != _FREEVARS or code.co_kwonlyargcount != 0:
        return False
    if code.co_flags & inspect.CO_VARKEYWORDS:
        return False
    if boxed:
        return (
            code.co_argcount == 1
            and not code.co_flags & inspect.CO_VARARGS
            and code.co_names == ("extend", "clear", "AssertionError")
        )
    return (
        code.co_argcount == 0
        and bool(code.co_flags & inspect.CO_VARARGS)
        and code.co_names == ("extend", "AssertionError")
    )


def _forward_codes(aot_autograd) -> dict:
    """{code of each verified forward closure: boxed}"""
    fn = aot_autograd.__dict__.get("aot_module_simplified")
    consts = getattr(getattr(fn, "__code__", None), "co_consts", ())
    codes = {}
    for c in consts:
        if isinstance(c, types.CodeType) and c.co_name == "forward":
            boxed = c.co_argcount == 1
            if _is_verified(c, boxed):
                codes[c] = boxed
    return codes if sorted(codes.values()) == [False, True] else {}


def _c_forward(forward, wrapped, boxed: bool):
    from . import _C

    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__))
    ours = _C.ParamsPrepend(wrapped, cells["compiled_fn"], cells["params_buffers_flat"], boxed)
    ours.__dict__.update(wrapped.__dict__)
    for name in _ATTRIBUTES:
        setattr(ours, name, getattr(wrapped, name))
    return ours


def install(aot_autograd):
    """Put our ``simple_wraps`` in ``aot_autograd``'s globals; returns the
    ``_state.Replaced`` record, or None where it has none."""
    from ._state import closed, count_built, count_fallback, is_enabled, replace

    upstream = aot_autograd.__dict__.get("simple_wraps")
    if upstream is None:
        return None
    codes = _forward_codes(aot_autograd)

    def decorate(upstream_decorator, forward):
        wrapped = upstream_decorator(forward)
        boxed = codes.get(getattr(forward, "__code__", None))
        if boxed is None:
            if getattr(forward, "__qualname__", None) == _QUALNAME:
                count_fallback("params prepend: aot_module_simplified's forward is not "
                                "the verified closure")
            return wrapped
        reason = closed()
        if reason is not None:
            count_fallback(f"params prepend: {reason}")
            return wrapped
        ours = _c_forward(forward, wrapped, boxed)
        count_built("params_prepends")
        return ours

    @functools.wraps(upstream)
    def simple_wraps(f):
        upstream_decorator = upstream(f)
        if not is_enabled():
            return upstream_decorator
        return functools.partial(decorate, upstream_decorator)

    return replace(aot_autograd, "simple_wraps", simple_wraps)
