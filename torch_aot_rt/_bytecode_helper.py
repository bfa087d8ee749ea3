"""The functions of ``torch._dynamo.utils`` that Dynamo's transformed
bytecode calls per call, in C (``_C.BytecodeHelper``,
csrc/dynamo/bytecode_helper.c): ``record_pregraph_bytecode_enter`` and
``_exit`` around a graph's argument preparation, and ``call_size``,
``call_stride`` and ``call_storage_offset`` for the dynamic sizes a graph
takes (``dynamic=True``, automatic dynamic shapes).

Each is ``torch._disable_dynamo``'s ``inner`` over a small function; the
bytecode looks it up on the module at every call, so the module attribute
is what we replace. Here we check that each is that ``inner`` over the
verified function, and do what ``inner`` does on its first call (make the
``torch._dynamo.disable`` wrapper and cache it on the function) so that the
C hook knows the wrapper to expect. The hooks follow the C runtime's switch
on every call (the bytecode that calls them is shared by every compile).

2.15's bytecode calls the pregraph pair only while a profiler is attached
(it reads ``torch.autograd.profiler._is_profiler_enabled`` first), and makes
them plain functions whose frames the eval-frame hook skips: nothing runs per
call to replace, so they stay upstream's there, and are not counted as a
fallback. The tensor-property three are replaced on every release.
"""

from __future__ import annotations

import types

PREGRAPH = ("record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit")
TENSOR_PROPERTIES = ("call_size", "call_stride", "call_storage_offset")


def install(release) -> list | str:
    """Replace the helpers; the Replaced records, or why they stay
    upstream's."""
    names = (PREGRAPH if release.pregraph_per_call else ()) + TENSOR_PROPERTIES
    import torch
    import torch._compile
    import torch._dynamo
    import torch._dynamo.utils as utils

    from . import _C, _state

    unavailable = _state.disable_unavailable()
    if unavailable is not None:
        return f"the disable wrapper is not mirrored: {unavailable}"
    code = _state.nested_code(torch._compile._disable_dynamo.__code__, "inner")
    if code is None or code.co_freevars != ("fn", "recursive"):
        return "torch._disable_dynamo's inner is not the verified one"
    hooks = []
    for name in names:
        inner = utils.__dict__.get(name)
        if not isinstance(inner, types.FunctionType) or inner.__code__ is not code:
            return f"torch._dynamo.utils.{name} is not torch._disable_dynamo's inner"
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in inner.__closure__)))
        fn, recursive = cells["fn"], cells["recursive"]
        if recursive is not True:
            return f"torch._dynamo.utils.{name} is not disabled recursively"
        wrapper = getattr(fn, "__dynamo_disable", None)
        if wrapper is None:
            # what inner does on its first call
            wrapper = torch._dynamo.disable(fn, recursive, wrapping=False)
            fn.__dynamo_disable = wrapper
        hooks.append((name, _C.BytecodeHelper(inner, fn, wrapper, _state._enabled, name=name)))
    return [_state.replace(utils, name, hook) for name, hook in hooks]
