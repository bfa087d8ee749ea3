"""``torch._dynamo.disable``'s wrapper, in C (``_C.DisabledCall``,
csrc/dynamo/disable.c), where it runs on every call of a compiled function.

AOTAutograd's Dynamo backend wraps each compiled backward in
``torch._dynamo.disable``, and Dynamo wraps each graph it compiles in one
before installing it as the frame's ``__compiled_fn_...`` global, which the
transformed bytecode calls; so every call runs ``DisableContext.__call__``'s
``_fn`` (torch/_dynamo/eval_frame.py). Here we check that ``_fn`` and the
helpers it calls are the ones the C version mirrors, and bind what it reads;
the C CompiledBackward then calls a ``DisabledCall`` in place of the
wrapper, and Dynamo installs one in place of the graph's
(:func:`install_graph_globals`). That choice is made once per compiled
backward or graph; each call still runs upstream's ``_fn`` itself where the
state is not the one the C version handles (counted in
``stats()["dynamo_disable"]``).
"""

from __future__ import annotations

import inspect
import types

from . import _state

# What _fn reads (its code's names) on every verified release.
_FN_NAMES = frozenset(
    {
        "set_eval_frame", "_maybe_set_eval_frame", "_callback_from_stance", "callback",
        "getattr", "type", "__name__", "torch", "compiler", "is_exporting", "fx_traceback",
        "annotate",
    }
)
_FN_FREEVARS = ("fn", "self")


def _wrapper_code(context_cls) -> types.CodeType | str:
    """The code of ``context_cls.__call__``'s ``_fn``, or why it is not the
    verified one."""
    call = getattr(context_cls.__dict__.get("__call__"), "__code__", None)
    code = _state.nested_code(call, "_fn") if call is not None else None
    if code is None:
        return "DisableContext.__call__ defines no single _fn"
    flags = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
    if (
        code.co_freevars != _FN_FREEVARS
        or set(code.co_names) != _FN_NAMES
        or code.co_argcount != 0
        or code.co_flags & flags != flags
    ):
        return "DisableContext.__call__'s _fn is not the verified one"
    return code


def install(release) -> str | None:
    """Bind the C wrapper's state; returns why it is unavailable, or None."""
    import torch
    import torch._C._dynamo.eval_frame as c_eval_frame
    import torch._dynamo.eval_frame as eval_frame
    import torch.compiler

    from . import _C

    code = _wrapper_code(eval_frame.DisableContext)
    if isinstance(code, str):
        return code
    set_eval_frame = c_eval_frame.set_eval_frame
    if eval_frame.set_eval_frame is not set_eval_frame:
        return "eval_frame.set_eval_frame is not torch._C._dynamo.eval_frame's"
    if eval_frame._maybe_set_eval_frame is not set_eval_frame:
        return "eval_frame._maybe_set_eval_frame is the JustKnobs-guarded one"
    is_exporting = torch.compiler.is_exporting
    if getattr(is_exporting, "__code__", None) is None or is_exporting.__code__.co_names != (
        "_is_exporting_flag",
    ):
        return "torch.compiler.is_exporting is not the verified one"
    _C._bind_disable(
        fn_code=code,
        boxed_code=_boxed_code(),
        fn_cell=_FN_FREEVARS.index("fn"),
        ctx_cell=_FN_FREEVARS.index("self"),
        DisableContext=eval_frame.DisableContext,
        eval_frame=eval_frame,
        torch=torch,
        compiler=torch.compiler,
        set_eval_frame=set_eval_frame,
        callback_from_stance=eval_frame._callback_from_stance,
        is_exporting=is_exporting,
        skips_none_callback=release.disable_skips_none_callback,
    )
    return None


def _boxed_code():
    """The code of make_boxed_func's ``g`` (``return f(*args)``, f its one
    free variable): a DisabledCall over it calls f with the list unpacked,
    without g's frame; None where it is not that."""
    from torch._functorch._aot_autograd.utils import make_boxed_func

    code = _state.nested_code(make_boxed_func.__code__, "g")
    if code is None or code.co_freevars != ("f",) or code.co_argcount != 1:
        return None
    return code


GRAPH_GLOBAL_PREFIX = "__compiled_fn"


def install_graph_globals():
    """Dynamo's compiled graphs get a ``DisabledCall`` over their disable
    wrapper: ``OutputGraph.install_global_unsafe`` (how
    ``compile_and_call_fx_graph`` installs the wrapped graph as the frame's
    global) is wrapped to install it instead, for compiles with the C runtime
    on. Returns the ``_state.Replaced`` record, or why not."""
    import torch._dynamo.output_graph as output_graph

    from . import _C

    if _state.disable_unavailable() is not None:
        return f"the disable wrapper is not mirrored: {_state.disable_unavailable()}"
    cls = output_graph.OutputGraph
    upstream = cls.__dict__.get("install_global_unsafe")
    code = getattr(upstream, "__code__", None)
    if code is None or code.co_varnames[:3] != ("self", "name", "value") or code.co_argcount != 3:
        return "OutputGraph.install_global_unsafe is not the verified one"

    def install_global_unsafe(self, name, value):
        if _state.is_enabled() and isinstance(name, str) and name.startswith(GRAPH_GLOBAL_PREFIX):
            value = _C._disable_wrapper_for(value)
        return upstream(self, name, value)

    install_global_unsafe.__wrapped__ = upstream
    install_global_unsafe.__name__ = upstream.__name__
    install_global_unsafe.__qualname__ = upstream.__qualname__
    install_global_unsafe.__doc__ = upstream.__doc__
    return _state.replace(cls, "install_global_unsafe", install_global_unsafe)

