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

import functools

CELLS = ("callback", "fn", "is_fx_symbolic_tracing", "is_jit_tracing", "self")


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

    from . import _C, _state

    if not release.compile_wrapper_mirrored:
        return f"not mirrored for torch {release.name}"
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
    if patcher is None:
        return "ConfigModule._make_closure_patcher is not the verified one"
    keys_cpp = release.compile_wrapper_cpp_key_stack
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
        include_set=None if keys_cpp else torch._C._dispatch_tls_local_include_set,
        exclude_set=None if keys_cpp else torch._C._dispatch_tls_local_exclude_set,
        force_guard=None if keys_cpp else torch._C._ForceDispatchKeyGuard,
        save_keys=torch._C._dynamo_save_local_dispatch_key_set if keys_cpp else None,
        restore_keys=torch._C._dynamo_restore_local_dispatch_key_set if keys_cpp else None,
        eager_nested=eval_frame._force_eager_nested_compile if keys_cpp else None,
        fx_flag_tls=symbolic_trace._is_fx_tracing_tls if release.fx_tracing_flag_tls else None,
        tag_patch_attr=release.generation_tag_patch_attr,
        tag_patch_present=release.generation_tag_patch_attr == "___has_generation_tag_patch",
        compiler_errors=(exc.Unsupported, exc.UncapturedHigherOrderOpError, exc.UserError),
        shorten_traceback=exc.ShortenTraceback,
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
        ours = _C.ModuleCall(
            upstream=module_cls.__dict__["__call__"],
            module_cls=torch.nn.Module,
            eval_frame=eval_frame,
            nn_module=torch.nn.modules.module,
        )
        replaced.append(_state.replace(module_cls, "__call__", ours))
    else:
        _state.count_fallback("OptimizedModule.__call__: its class is not the verified one")
    return replaced
