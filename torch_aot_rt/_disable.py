"""``torch._dynamo.disable``'s wrapper around the compiled backward, in C
(``_C.DisabledCall``, csrc/dynamo/disable.c).

AOTAutograd's Dynamo backend wraps each compiled backward in
``torch._dynamo.disable``, so every backward call runs
``DisableContext.__call__``'s ``_fn`` (torch/_dynamo/eval_frame.py). Here we
check that ``_fn`` and the helpers it calls are the ones the C version
mirrors, and bind what it reads; the C CompiledBackward then calls a
``DisabledCall`` in place of the wrapper. That choice is made once per
compiled backward; each call still runs upstream's ``_fn`` itself where the
state is not the one the C version handles (counted in
``stats()["dynamo_disable"]``).
"""

from __future__ import annotations

import inspect
import types

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
    nested = [
        c for c in (call.co_consts if call else ())
        if isinstance(c, types.CodeType) and c.co_name == "_fn"
    ]
    if len(nested) != 1:
        return "DisableContext.__call__ defines no single _fn"
    code = nested[0]
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
