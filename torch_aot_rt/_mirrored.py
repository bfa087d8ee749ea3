"""The upstream code the C path mirrors or depends on, and its fingerprints.

A version string is a weak proof that the running torch is the code we read:
a patch release, a distribution's rebuild or a local fix can change it without
changing the series. So each verified release also records a fingerprint of
the source of every piece of upstream code listed in :data:`MIRRORED` (read
from the files, found by name with :mod:`ast`, hashed); the installer opens the
gate only when the running torch's fingerprints equal its entry's, and
otherwise names the first piece that differs.

The source is read from the files of the installed torch, without importing
any of them (a closed gate imports nothing), and the same code reads a torch
from a wheel or another virtual environment: ``scripts/release_diff.py`` uses
it to print what changed between two releases, piece by piece, which is the
first step of adding a release. Stdlib only: the script loads this file by path.
"""

from __future__ import annotations

import ast
import hashlib
import os
import textwrap

# (file under torch/, names in it): a top-level function, class or global
# (a class covers all its methods), or Class.method. What of ours depends on
# each is noted beside it.
MIRRORED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_functorch/_aot_autograd/runtime_wrappers.py", (
        # csrc/aot/runtime_wrapper.c, csrc/aot/epilogue.c, _plan.py: the runtime
        # wrapper, its generated source and the reference Python it mirrors
        "RuntimeWrapper",
        "NoopAliasHandler",
        "_unwrap_tensoralias",
        "AliasOfInputHandler",
        "IsInputHandler",
        "AliasOfIntermediateHandler",
        "make_output_handler",
        "mark_dynamo_propagated_dynamic_indices",
        "_should_disable_saved_tensors_hooks",
        "_check_custom_op_aliasing",
        "_FirstInvocationContext",
        "_RuntimeCompiledFnInvoker",
        "_RuntimeForwardEpilogue",
        "_codegen_capture_orig_inputs",
        "_codegen_increment_mutation_versions",
        "_codegen_normalize_as_list",
        "_codegen_compiled_fn_invocation",
        "_codegen_epilogue",
        "_create_runtime_wrapper",
        # 2.11/2.12's reference runtime wrapper stamps dynamic dims with it
        "maybe_mark_dynamic_helper",
        "_disable_saved_tensors_hooks",
        # csrc/aot/autograd/serializable_call.c
        "SerializableCompiledFunction",
        # csrc/aot/autograd/compiled_forward.c, compiled_backward.c, autograd_function.c,
        # _autograd_plan.py: CompiledFunction and how it is built
        "_snapshot_external_objects",
        "coerce_to_expected_memory_format",
        "AOTDispatchAutogradCompileSpec",
        "_AutogradSavedState",
        "_AutogradForwardEpilogue",
        "_AutogradRngStateTracker",
        "_AutogradBackwardCompiler",
        "_codegen_backward_prologue",
        "_codegen_backward_epilogue",
        "_codegen_compiled_forward",
        "_codegen_compiled_backward",
        # 2.11/2.12's reference CompiledFunction.backward runs these
        "_raise_if_functorch_active",
        "_backward_prologue_functional",
        "_backward_epilogue_functional",
        "_AOTDispatchAutogradFunctionFactory",
        "AOTDispatchAutograd",
        # csrc/aot/wrappers/*_wrapper.c, _wrappers.py: the other per-call compiler wrappers
        "AOTDedupeWrapper.remove_dupe_args",
        "AOTDedupeWrapper.add_dupe_args",
        "AOTDedupeWrapper.post_compile",
        "EffectTokensWrapper.post_compile",
        "AOTSyntheticBaseWrapper.post_compile",
        "FunctionalizedRngRuntimeWrapper.post_compile",
        "FakifiedOutWrapper.post_compile",
        "DebugAssertWrapper.post_compile",
        # csrc/aot/wrappers/subclass_wrapper.c, _subclass_wrapper.py: the subclass wrapper
        "AOTDispatchSubclassWrapper",
    )),
    ("_functorch/_aot_autograd/subclass_codegen.py", (
        # csrc/aot/wrappers/subclass_wrapper.c, _subclass_wrapper.py: the generated subclass
        # wrapper (the placeholder helpers are called at build)
        "_is_symint_placeholder",
        "_compute_placeholders",
        "_safe_attr_access",
        "_concrete_value",
        "_OutputWrapState",
        "_is_optional_symint_output",
        "_codegen_unwrap_subclass",
        "_codegen_wrap_subclass",
        "_count_output_args",
        "_emit_optional_symint_skip",
        "_emit_optional_plain_tensor_symint_skips",
        "_emit_output_wrapping",
        "_emit_input_unwrapping",
        "_codegen_subclass_wrapper_source",
        "_compile_and_exec_source",
        "codegen_subclass_wrapper",
    )),
    ("_tensor.py", (
        # csrc/aot/wrappers/dedupe_wrapper.c skips hashing plain tensors: id(self)
        "Tensor.__hash__",
    )),
    ("_functorch/_aot_autograd/codegen.py", (
        # _trace.py: where upstream's generated sources go (tlparse, capture)
        "_current_capture_sink",
        "_current_trace_sink",
        "_format_runtime_wrapper_sources",
        "_trace_runtime_wrapper_sources",
        "aggregate_runtime_wrapper_sources",
        "capture_generated_sources",
        # _subclass_wrapper.py: how the generated subclass wrapper is made (2.14 on)
        "_compile_and_exec_source",
    )),
    ("_functorch/_aot_autograd/functional_utils.py", (
        # csrc/aot/epilogue.c: alias replay
        "gen_alias_from_base",
    )),
    ("_functorch/_aot_autograd/utils.py", (
        "make_boxed_func",
        "call_func_at_runtime_with_args",
        "normalize_as_list",
        # _saved_hooks_guard.py / csrc/dynamo/saved_hooks_guard.c
        "top_saved_tensors_hooks",
        "saved_tensors_hooks_are_inlineable",
        # _params_prepend.py
        "simple_wraps",
    )),
    ("_functorch/_aot_autograd/schemas.py", (
        # what plans read
        "OutputType",
        "MutationType",
        "ViewAndMutationMeta",
        "PlainTensorMeta",
        "MemoryFormatMeta",
        "OpaqueMeta",
        "SubclassCreationMeta",
    )),
    ("_functorch/aot_autograd.py", (
        # csrc/aot/autograd/params_prepend.c: its forward closures
        "aot_module_simplified",
    )),
    ("autograd/grad_mode.py", (
        # 2.11/2.12's runtime wrapper forces view replay with the first;
        # every release enters the second around the training call
        "_force_original_view_tracking",
        "enable_grad",
    )),
    ("autograd/function.py", (
        # csrc/aot/autograd/function_apply.c, csrc/cpp/: Function.apply, the ctx, apply_boxed
        "FunctionCtx",
        "BackwardCFunction",
        "FunctionMeta",
        "Function",
    )),
    ("_dynamo/graph_bytecode_inputs.py", (
        # the external-object snapshot and its restore
        "index_to_external_object_weakref",
        "set_external_object_by_index",
        "store_user_object_weakrefs",
    )),
    ("_dynamo/guards.py", (
        "GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS",
    )),
    ("_dynamo/utils.py", (
        # csrc/dynamo/bytecode_helper.c: the functions the transformed bytecode
        # calls around a graph's argument preparation
        "record_pregraph_bytecode_enter",
        "record_pregraph_bytecode_exit",
        # ... and those it calls for a dynamic size, stride or offset
        "call_size",
        "call_stride",
        "call_storage_offset",
        # csrc/inductor/graph_call.c's finally
        "_metrics_context_tls",
        "get_runtime_metrics_context",
        # compile_wrapper's error_on_graph_break
        "_get_error_on_graph_break",
        "_set_error_on_graph_break",
    )),
    ("_dynamo/codegen.py", (
        # how the bytecode calls them (2.15: only under the profiler)
        "PyCodegen.make_call_generated_code",
    )),
    ("_compile.py", (
        # their decorator's inner (_bytecode_helper.py checks its code)
        "_disable_dynamo",
    )),
    ("_inductor/output_code.py", (
        # csrc/inductor/graph_call.c and what it reads or calls per call
        "CompiledFxGraph.__call__",
        "CompiledFxGraph.post_compile",
    )),
    ("_inductor/debug.py", (
        "RECORD_GRAPH_EXECUTION",
        "GRAPH_EXECUTION_ORDER",
    )),
    ("_inductor/runtime/autotune_cache.py", (
        "AutotuneCacheBundler.has_active_compile",
        "AutotuneCacheBundler._get_context_bundler",
        "AutotuneCacheBundler.end_compile",
    )),
    ("_dynamo/metrics_context.py", (
        "RuntimeMetricsContext.finish",
    )),
    ("_dynamo/output_graph.py", (
        # _disable.install_graph_globals: how a compiled graph, wrapped in
        # torch._dynamo.disable, becomes the frame's __compiled_fn global
        "OutputGraph.install_global_unsafe",
        "OutputGraph.compile_and_call_fx_graph",
    )),
    ("_dynamo/compiled_autograd.py", (
        # csrc/cpp/compiled_node_compiled_autograd.cpp: what compiled
        # autograd's compiler does with a CompiledFunction node's ctx (the
        # arguments it is called with, what it reads, the origin check)
        "AutogradCompilerInstance.proxy_call_backward",
        "AutogradCompilerInstance.proxy_call_aot_backward",
        "AutogradCompilerInstance.set_node_origin",
    )),
    ("_dynamo/eval_frame.py", (
        # csrc/dynamo/disable.c
        "DisableContext",
        "_callback_from_stance",
        "_maybe_set_eval_frame",
        # csrc/dynamo/compile_wrapper.c: compile_wrapper (in __call__), the
        # enter hooks (in __init__), and the helpers it calls
        "_TorchDynamoContext",
        "OptimizeContext",
        "DynamoStance",
        "_is_skip_guard_eval_unsafe_stance",
        "reset_skip_reasons",
        "get_skip_reasons",
        "_get_eval_frame_override",  # 2.11: its body inlined under fullgraph
        "_is_eager_on_nested_compile",
        "_force_eager_nested_compile",
        # the config patcher dynamic= adds to the enter hooks (called as is)
        "make_set_enable_dynamic",
        # csrc/dynamo/optimized_module.c
        "OptimizedModule.__call__",
        "_set_in_optimized_module",
        "_in_optimized_module",
    )),
    ("nn/modules/module.py", (
        "_has_any_global_hook",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_forward_hooks_always_called",
        "_global_forward_hooks_with_kwargs",
    )),
    ("_guards.py", (
        "TracingContext.try_get",
        "_TLS",
        "_TLSStorage",
    )),
    ("fx/_symbolic_trace.py", (
        "is_fx_symbolic_tracing",
        "_is_fx_tracing_flag",
        "_get_is_fx_tracing",
        "_is_fx_tracing_tls",
    )),
    ("_dynamo/mutation_guard.py", (
        "install_generation_tagging_init",
        "GenerationTracker",
    )),
    ("compiler/__init__.py", (
        "is_exporting",
    )),
    ("utils/_config_module.py", (
        # csrc/config_read.c: a config setting read, as __getattr__ returns it
        "ConfigModule.__getattr__",
        "ConfigModule._warn_if_deprecated",
        "ConfigModule._get_alias_val",
        "ConfigModule._get_alias_module_and_name",
        "_ConfigEntry",
        "_UNSET_SENTINEL",
        "_IMMUTABLE_CONFIG_TYPES",
        # csrc/dynamo/compile_wrapper.c calls the enter hook it makes (its
        # `change`), trusting it to touch only config overrides
        "ConfigModule._make_closure_patcher",
        "ConfigModule._mark_get_dict_dirty",
    )),
)


def names() -> list[str]:
    """Every mirrored piece as ``file:name``, in table order."""
    return [f"{path}:{name}" for path, pieces in MIRRORED for name in pieces]


def _top_level(body: list, name: str) -> list:
    """The module-level statements defining ``name``, including those under a
    module-level ``if``/``try`` (a name defined per condition)."""
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                found.append(node)
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found.append(node)
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                found.append(node)
        elif isinstance(node, ast.If):
            found += _top_level(node.body, name) + _top_level(node.orelse, name)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                found += _top_level(part, name)
            for handler in node.handlers:
                found += _top_level(handler.body, name)
    return found


def _segment(lines: list[str], node) -> str:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
    return textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))


def sources(torch_dir: str) -> dict[str, str | None]:
    """``{file:name: source}`` of every mirrored piece in the torch package at
    ``torch_dir`` (None where the file or the name does not exist)."""
    out: dict[str, str | None] = {}
    for path, pieces in MIRRORED:
        try:
            with open(os.path.join(torch_dir, path), encoding="utf-8") as f:
                text = f.read()
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            tree = None
        lines = text.splitlines(keepends=True) if tree is not None else []
        for name in pieces:
            key = f"{path}:{name}"
            if tree is None:
                out[key] = None
                continue
            head, _, method = name.partition(".")
            nodes = _top_level(tree.body, head)
            if method:
                nodes = [
                    m for cls in nodes if isinstance(cls, ast.ClassDef)
                    for m in cls.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == method
                ]
            out[key] = "".join(_segment(lines, n) for n in nodes) if nodes else None
    return out


def digest(source: str | None) -> str | None:
    if source is None:
        return None
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def fingerprints(torch_dir: str) -> dict[str, str | None]:
    """``{file:name: digest or None}`` of the torch package at ``torch_dir``."""
    return {key: digest(src) for key, src in sources(torch_dir).items()}


def mismatch(expected: dict, torch_dir: str) -> str | None:
    """Why the torch at ``torch_dir`` is not the code ``expected`` records
    (naming the first piece that differs), or None."""
    actual = fingerprints(torch_dir)
    for key in names():
        want, have = expected.get(key), actual[key]
        if want == have:
            continue
        if have is None:
            return f"{key} is missing (the verified release has it)"
        if want is None:
            return f"{key} exists (the verified release has none)"
        return f"{key} differs from the verified source"
    return None
