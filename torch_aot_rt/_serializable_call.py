"""``SerializableCompiledFunction.__call__`` in C (``_C.SerializableCall``).

AOTAutograd wraps what it compiles in a ``SerializableCompiledFunction``
(runtime_wrappers.py) whose ``__call__`` is a Python pass-through,
``self.compiled_fn(*args, **kwargs)``, run on every call. An instance created
while the C path is on becomes an instance of our subclass (same name, module
and ``__init__``; ``isinstance`` and ``serialize()`` unchanged) whose
``__call__`` is the C pass-through. The choice is made when the instance is
created, like every other plan; instances created with the C path off, on an
unverified torch, or where ``__call__`` is not the verified pass-through stay
upstream's (the last counted).
"""

from __future__ import annotations

import functools
import inspect


def _is_pass_through(call) -> bool:
    """``def __call__(self, *args, **kwargs): return self.compiled_fn(*args, **kwargs)``"""
    code = getattr(call, "__code__", None)
    if code is None:
        return False
    flags = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
    return (
        code.co_argcount == 1
        and code.co_kwonlyargcount == 0
        and code.co_flags & flags == flags
        and code.co_names == ("compiled_fn",)
    )


def install(rw):
    """Wrap ``SerializableCompiledFunction.__init__``; returns the
    ``_state.Replaced`` record, or None where this torch has no such class."""
    from . import _C
    from ._state import closed, count_built, count_fallback, is_enabled, replace

    base = getattr(rw, "SerializableCompiledFunction", None)
    if base is None or "__init__" not in base.__dict__:
        return None
    upstream_init = base.__dict__["__init__"]
    c_cls = None
    if closed() is None:
        c_cls = type(base.__name__, (base,), {"__call__": _C.SerializableCall()})
        c_cls.__module__ = base.__module__
        c_cls.__qualname__ = base.__qualname__
        c_cls.__doc__ = base.__doc__

    @functools.wraps(upstream_init)
    def __init__(self, *args, **kwargs):
        upstream_init(self, *args, **kwargs)
        if type(self) is not base or c_cls is None or not is_enabled():
            return
        if not _is_pass_through(base.__dict__.get("__call__")):
            count_fallback(
                "SerializableCompiledFunction.__call__ is not the verified pass-through"
            )
            return
        self.__class__ = c_cls
        count_built("serializable_functions")

    return replace(base, "__init__", __init__)
