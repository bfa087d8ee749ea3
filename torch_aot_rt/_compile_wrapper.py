"""Dynamo's ``compile_wrapper`` (what ``torch.compile`` returns for a
function, and an ``OptimizedModule``'s forward) in C (``_C.CompileWrapper``,
csrc/dynamo/compile_wrapper.c).

``_TorchDynamoContext.__call__`` makes a ``compile_wrapper`` closure per
compiled function; we wrap ``__call__`` so that, when the C runtime is on,
the caller gets a ``CompileWrapper`` over that closure instead (which hands
any call it does not handle to the closure). Here we check that the closure
and what it calls are the verified ones and bind what the C version reads.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types

CELLS = ("callback", "fn", "is_fx_symbolic_tracing", "is_jit_tracing", "self")
PATCHER_CELLS = ("changes", "config", "self")


# a call of one positional argument: CALL from 3.11, CALL_METHOD (after
# LOAD_METHOD) or CALL_FUNCTION on 3.10
CALL_OPS = ("CALL", "CALL_METHOD", "CALL_FUNCTION")


def fullgraph_warning(code, eval_frame):
    """2.12's ``torch._dynamo.utils.warn_once(<message>)`` in
    compile_wrapper (fullgraph=True and no compiled frame) as a function of
    no arguments whose one frame is that line of eval_frame.py, in its
    globals: warn_once warns with stacklevel=2, so the warning names this
    frame's file, line and module, as upstream's does. None where the call
    is not ``<warn_once>(<one constant string>)``."""
    found = None
    instructions = list(dis.get_instructions(code))
    # where each line starts (CPython 3.10's instructions have no positions)
    starts = sorted(dis.findlinestarts(code))
    for i, ins in enumerate(instructions):
        if ins.argval != "warn_once" or ins.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
            continue
        rest = [x for x in instructions[i + 1:i + 4] if x.opname != "PRECALL"]
        if (len(rest) < 2 or rest[0].opname != "LOAD_CONST" or not isinstance(rest[0].argval, str)
                or rest[1].opname not in CALL_OPS or rest[1].arg != 1):
            return None
        # the frame's line during the call: what warn_once's warning names
        positions = getattr(rest[1], "positions", None)
        if positions is not None:
            line = positions.lineno
        else:
            before = [ln for off, ln in starts if off <= rest[1].offset and ln is not None]
            line = before[-1] if before else None
        if line is None:
            return None
        call = (line, rest[0].argval)
        if found not in (None, call):  # the finally block's copies: one call
            return None
        found = call
    if found is None or found[0] < 2:
        return None
    line, message = found
    source = "\n" * (line - 2) + (
        f"def compile_wrapper():\n    torch._dynamo.utils.warn_once({message!r})\n")
    module_code = compile(source, code.co_filename, "exec")
    body = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(body, vars(eval_frame), "compile_wrapper")


def _frames_of(code, release, globals_):
    """compile_wrapper's frame stubs (``_frames``), one per way an
    exception leaves it (in _C's order: the call of fn, the re-raise of a
    compiler error, of a ShortenTraceback, fullgraph's no-compiled-frames
    error), None where that exit is not found (no entry is then added); and
    on CPython 3.11 the trampoline its functions run (the stub at the call,
    with the placeholder for C's object), else None. (None, None) where the
    call itself is not found."""
    from . import _C, _frames

    at_call = _frames.call_of(code, "fn")
    if at_call is None:
        return None, None
    positions = (
        at_call,
        _frames.raise_after(code, "with_traceback", "__cause__", nargs=2),
        _frames.raise_after(code, "remove_dynamo_frames", nargs=2),
        # 2.12's warning has its own frame (fullgraph_warning), 2.11 raises none
        _frames.raise_after(code, "RuntimeError", "msg", nargs=1)
        if release.compile_wrapper_fullgraph == "raise" else None,
    )
    frames = tuple(
        None if at is None else _frames.stub(code, at, _C._reraise, globals_)
        for at in positions
    )
    if frames[0] is None:
        return None, None
    trampoline = None
    if _C.FUNCTION_CALLS_INLINED:
        # CPython 3.11's interpreter runs a function's frame without its
        # vectorcall: the function runs this code, whose frame gives the
        # traceback the entry of each exit itself
        trampoline = _frames.trampoline(
            code, at_call, [(k, at) for k, at in enumerate(positions) if k and at is not None],
            globals_)
        if trampoline is None:
            return None, None
        frames = (None,) * len(frames)
    return frames, trampoline


def install(release) -> list | str:
    """Bind the C compile_wrapper and wrap ``_TorchDynamoContext.__call__``;
    the Replaced record, or why it stays upstream's."""
    import torch
    import torch._C._functorch as functorch
    import torch._dynamo.eval_frame as eval_frame
    import torch._dynamo.exc as exc
    import torch._dynamo.mutation_guard as mutation_guard
    import torch._guards
    import torch.compiler
    import torch.fx._symbolic_trace as symbolic_trace
    from torch.utils._config_module import ConfigModule

    from . import _C, _frames, _state

    cls = eval_frame._TorchDynamoContext
    upstream = cls.__dict__.get("__call__")
    upstream_code = getattr(upstream, "__code__", None)
    code = _state.nested_code(upstream_code, "compile_wrapper") if upstream_code is not None else None
    if code is None or code.co_freevars != CELLS:
        return "_TorchDynamoContext.__call__'s compile_wrapper is not the verified one"
    call_on_enter = _state.nested_code(cls.__init__.__code__, "call_on_enter")
    on_enter = _state.nested_code(eval_frame.OptimizeContext.__init__.__code__, "on_enter")
    if call_on_enter is None or call_on_enter.co_freevars != ("on_enter",) or on_enter is None:
        return "the enter hook of torch.compile's context is not the verified one"
    # dynamic= / dynamic_shapes= add config patchers to the enter hooks
    patcher = _state.nested_code(ConfigModule._make_closure_patcher.__code__, "change")
    if patcher is None or patcher.co_freevars != PATCHER_CELLS:
        return "ConfigModule._make_closure_patcher is not the verified one"
    fullgraph_warn = None
    if release.compile_wrapper_fullgraph == "warn":
        fullgraph_warn = fullgraph_warning(code, eval_frame)
        if fullgraph_warn is None:
            return "compile_wrapper's fullgraph warning is not the verified one"
    frames, trampoline = _frames_of(code, release, vars(eval_frame))
    if frames is None:
        return "compile_wrapper's frame cannot be reproduced on this Python"
    keys_saved = release.compile_wrapper_saves_dispatch_keys
    keys_cpp = keys_saved and release.compile_wrapper_cpp_key_stack
    keys_guard = keys_saved and not keys_cpp
    _C._bind_compile_wrapper(
        code=code,
        cells=tuple(CELLS.index(n) for n in CELLS),
        call_on_enter_code=call_on_enter,
        on_enter_code=on_enter,
        patcher_code=patcher,
        eval_frame=eval_frame,
        stance_cls=eval_frame.DynamoStance,
        guards=torch._guards,
        compiler=torch.compiler,
        fx=symbolic_trace,
        is_jit_tracing=torch._C._is_tracing,
        module_cls=torch.nn.Module,
        generation_tracker=mutation_guard.GenerationTracker,
        get_depth=functorch.get_dynamic_layer_stack_depth,
        pop_depth=functorch.pop_dynamic_layer_stack_and_undo_to_depth,
        include_set=torch._C._dispatch_tls_local_include_set if keys_guard else None,
        exclude_set=torch._C._dispatch_tls_local_exclude_set if keys_guard else None,
        force_guard=torch._C._ForceDispatchKeyGuard if keys_guard else None,
        save_keys=torch._C._dynamo_save_local_dispatch_key_set if keys_cpp else None,
        restore_keys=torch._C._dynamo_restore_local_dispatch_key_set if keys_cpp else None,
        eager_nested=eval_frame._force_eager_nested_compile if keys_cpp else None,
        fx_flag_tls=symbolic_trace._is_fx_tracing_tls if release.fx_tracing_flag_tls else None,
        tag_patch_attr=release.generation_tag_patch_attr,
        tag_patch_present=release.generation_tag_patch_attr == "___has_generation_tag_patch",
        compiler_errors=(exc.Unsupported, exc.UncapturedHigherOrderOpError)
        + ((exc.UserError,) if release.compile_wrapper_strips_user_error else ()),
        shorten_traceback=exc.ShortenTraceback,
        isolate_recompiles=release.compile_wrapper_isolate_recompiles,
        eog_where_differs=release.compile_wrapper_eog_where_differs,
        patcher=release.config_patcher,
        fullgraph=release.compile_wrapper_fullgraph,
        fullgraph_warn=fullgraph_warn,
        frames=frames,
        trampoline=trampoline,
    )

    @functools.wraps(upstream)
    def __call__(self, fn, *args, **kwargs):
        result = upstream(self, fn, *args, **kwargs)
        if _state.is_enabled():
            return _C._compile_wrapper_for(result)
        return result

    replaced = [_state.replace(cls, "__call__", __call__)]
    # OptimizedModule.__call__: C for the modules whose forward is a C
    # compile_wrapper (made with the switch on); module_call_mro_checked:
    # super().__call__ is nn.Module's
    module_cls = eval_frame.OptimizedModule
    if module_cls.__mro__[1] is torch.nn.Module and "__call__" in module_cls.__dict__:
        upstream_call = module_cls.__dict__["__call__"]
        at = _frames.call_of(upstream_call.__code__, "__call__")
        ours = _C.ModuleCall(
            upstream=upstream_call,
            module_cls=torch.nn.Module,
            eval_frame=eval_frame,
            nn_module=torch.nn.modules.module,
            frame=None if at is None else _frames.stub(
                upstream_call.__code__, at, _C._reraise, vars(eval_frame)),
        )
        # what inspect.signature reads: upstream's (self, *args, **kwargs)
        ours.__signature__ = inspect.signature(upstream_call)
        replaced.append(_state.replace(module_cls, "__call__", ours))
    else:
        _state.count_fallback("OptimizedModule.__call__: its class is not the verified one")
    return replaced
