"""The torch releases the C path was verified against, and what each does.

Upstream changes AOTAutograd's runtime semantics between releases without
renaming anything, so a name look-up cannot tell whether our C code still
mirrors what runs. This table is the one place version-dependent behaviour
lives: every field is a semantic difference found by reading that release's
``torch/_functorch/_aot_autograd/`` (and ``torch/autograd/function.py``) side
by side with the previous one. Plans read these fields when a wrapper is
built; the C call path branches on plan bits, never on a version.

Adding a release means reading its source against the newest entry, adding
one entry here (new fields where it changed something), and parametrizing
the tests over what it does. On any torch not listed, every compile falls
back to upstream with the reason ``torch X.Y.Z is not a verified version``,
unless ``TORCH_AOT_RT_UNVERIFIED=1`` opts in (the nearest entry's semantics
are then assumed, and ``stats()`` says so).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    series: tuple[int, int]
    # _AutogradSavedState.save_from_forward: 2.13 detaches every saved tensor
    # that is a view; 2.14 keeps saved graph inputs as they are
    # (ViewAndMutationMeta.saved_tensor_is_graph_input), detaching only views
    # that are not graph inputs.
    keeps_saved_graph_inputs: bool
    # 2.14: the forward epilogue snapshots Dynamo's external-object registry
    # onto ctx (_snapshot_external_objects -> ctx._external_objects), and
    # _backward_impl restores it before calling the compiled backward.
    snapshots_external_objects: bool
    # _codegen_compiled_backward: 2.13 runs impl_fn as `context.run`, 2.14 as
    # `context.copy().run` (a ContextVar set in one backward stays there).
    copies_backward_context: bool
    # runtime_wrappers' module globals for the saved opaque-object check
    # (`is_opaque_type(type(obj)) or isinstance(obj, OpaqueBase)` in 2.13,
    # renamed is_custom_class / CustomClassBase in 2.14).
    opaque_type_check: str
    # None: the check is is_opaque_type(type(obj)) alone (2.11, whose
    # runtime_wrappers has no OpaqueBase); an OpaqueBase instance of an
    # unregistered type then fails the forward's assertion.
    opaque_base: str | None
    # torch.autograd.Function.apply: a Python classmethod in 2.13 (functorch
    # check, unwrap_dead_wrappers, then _FunctionBase.apply); 2.14 makes it
    # _FunctionBase.apply itself, with that logic in C++.
    function_apply_is_base: bool
    # Where the release can capture the generated runtime-wrapper source
    # (aot_autograd.compile_to_python): "module:function" returning the
    # active sink or None. A capture needs upstream's wrappers.
    source_capture_sink: str | None
    # torch._dynamo.disable's wrapper (DisableContext.__call__'s _fn), which
    # AOTAutograd's Dynamo backend puts around the compiled backward: 2.13
    # sets the stance's callback, and None on exit, unconditionally and reads
    # getattr(fn, "__name__", ...) first; 2.14 does each only when the
    # callback (or the prior one) is not None, and the name only when
    # exporting.
    disable_skips_none_callback: bool
    # Dynamo's external-object registry as runtime_wrappers imported it
    # (graph_bytecode_inputs.index_to_external_object_weakref): None where
    # runtime_wrappers has none (2.13), "dict" (2.14: the forward snapshots
    # `.items()`), "list" (2.15: it snapshots `enumerate(...)`, keys are list
    # positions). In 2.15 Dynamo's store_user_object_weakrefs rebinds
    # graph_bytecode_inputs' global to a new list, while runtime_wrappers
    # keeps the list it imported: the snapshot reads that (stale) list, as
    # we must. Bound once, at install, by _C._bind_torch.
    external_objects_registry: str | None
    # How _backward_impl puts the snapshot back before the compiled backward:
    # None, `registry[idx] = weakref.ref(obj)` on the registry above (2.14);
    # else the runtime_wrappers global it calls per entry (2.15:
    # set_external_object_by_index, which appends a strong reference to
    # graph_bytecode_inputs.keep_alive, writes the module's *current* list,
    # appends at idx == len and raises AssertionError past the end).
    external_objects_setter: str | None
    # codegen (2.15): the runtime-wrapper sources of one compile (or cache
    # hit) go to TORCH_TRACE as ONE artifact, aot_autograd_runtime_wrappers,
    # of "# <name>\n<source>" blocks (codegen.aggregate_runtime_wrapper_sources;
    # outside such a scope, one such artifact per source); 2.13/2.14 log each
    # source as its own artifact named after it. _trace.py logs the C plan's
    # description the same way.
    aggregates_runtime_wrapper_trace: bool
    # FunctionCtx.input_grad_buffers / _FunctionBase._input_grad_buffers
    # (2.15): the engine's current gradient buffers of the Function's inputs,
    # readable while its backward runs. The C++ node's grad_fn answers it
    # where its build has it (csrc/cpp, on the headers of 2.15 on); the
    # binding checks that the C++ part loaded agrees with this.
    has_input_grad_buffers: bool
    # _AutogradBackwardCompiler.get_or_compile (the lazy backward compile)
    # runs under torch._dynamo.utils.deferred_full_gc() (2.15: gen2 GC
    # threshold raised while it compiles). Inherited, not mirrored: the C
    # backward calls upstream's get_or_compile; the field records it for
    # the install check and the tests.
    backward_compile_defers_gc: bool
    # AOTDispatchSubclassWrapper's generated wrapper (subclass_codegen.py,
    # _codegen_subclass_wrapper_source; _subclass_wrapper.py builds the C program):
    # 2.13 reads the graph's outputs at indices fixed when it is generated and
    # returns the activations from the tally of wrapped outputs on; 2.14 reads
    # them with a running index (_out_idx), skips optional SymInt outputs
    # (_emit_optional_symint_skip), asserts the counts, takes a subclass's
    # outer size/stride from an inner attribute where its metadata says so
    # (outer_size_from_attr), appends the symbolic sizes/strides of plain
    # inner tensors (PlainTensorMeta.size_symbol_placeholders), and returns
    # the activations counted from the end.
    subclass_outputs_by_cursor: bool
    # The ViewAndMutationMeta field naming AsyncCollectiveTensor inputs,
    # which the generated wrapper waits on (those compiles keep upstream's):
    # act_input_indices (2.13), act_input_paths (2.14: paths into subclasses).
    subclass_act_inputs: str
    # process_runtime_tangent's fake check: isinstance(x, FakeTensor) (2.13);
    # is_fake_tensor(x), which also asks torch._C._is_fake_tensor(x) (2.14 on).
    # The C backward asks the same for a subclass tangent it processes itself.
    tangent_fake_check_cpp: bool
    # gen_alias_from_base's as_strided fallback: 2.14 adds the aliased base's
    # storage_offset() to the target's when their untyped storages differ
    # (`_cdata`: inductor's copy_misaligned_inputs cloned the input); 2.13
    # uses the target's offset as it is.
    alias_translates_storage_offset: bool
    # --- 2.11/2.12 against 2.13 (the runtime wrapper before codegen) ---
    # _create_runtime_wrapper generates its source (2.13 on: TORCH_TRACE
    # artifacts output_alias_wrapper, mutation_epilogue,
    # runtime_wrapper_orchestration); 2.11/2.12 run the reference Python
    # (_RuntimeCompiledFnInvoker.run, _RuntimeForwardEpilogue.finalize and its
    # handler objects) and log nothing. _trace.log_plan reads it.
    runtime_wrapper_generated: bool = True
    # training: view replay on through torch.autograd._force_original_view_tracking(True)
    # (2.11/2.12: its __init__ and __enter__ both set it, __exit__ restores it
    # unconditionally) instead of the generated read / set-if-off /
    # restore-if-changed -> plan bit view_replay_forced.
    forces_original_view_tracking: bool = False
    # the attribute the dynamic dims of outputs are stamped on, the one the
    # release's Dynamo reads: mark_dynamo_propagated_dynamic_indices (2.13 on)
    # or maybe_mark_dynamic_helper's _dynamo_weak_dynamic_indices (2.11/2.12)
    # -> plan field dynamic_dims_attr.
    dynamic_dims_attr: str = "_dynamo_propagated_dynamic_indices"
    # _apply_input_mutations: 2.11/2.12 test `meta.is_leaf and
    # original_inpt.requires_grad` and send everything else (a leaf that does
    # not require grad included) through the user-stream check; 2.13's
    # generated epilogue checks streams of non-leaves only -> mutation flag
    # MUT_LEAF_STREAM_ERROR.
    leaf_mutation_checks_stream: bool = False
    # the invocation goes through call_func_at_runtime_with_args, which raises
    # AssertionError("args must be a list, got ...") for an inference call
    # whose args is not a list (2.11/2.12); the generated call passes anything
    # -> plan bit args_list_check.
    invoker_checks_args_list: bool = False
    # set_/metadata-only mutations in training: 2.11/2.12 check TensorAlias
    # inline ("expected TensorAlias for updated_inpt, got ..."), 2.13 calls
    # _unwrap_tensoralias ("expected TensorAlias, got ...")
    # -> plan bit updated_alias_inline_check.
    updated_alias_inline_check: bool = False
    # the profiler range "AOTDispatcher Runtime Wrapper Prologue" is exited in
    # a `finally` when the call fails before reaching the compiled function
    # (2.12 on); 2.11's runtime_wrapper exits it only right before the call,
    # so an error before it drops the entered range without __exit__
    # -> plan bit prologue_range_exited_on_error.
    prologue_range_exited_on_error: bool = True
    # keep_input_mutations' version bump: 2.11/2.12 call
    # increment_version((args[i] for i in ...)), whose C++ binding bumps each
    # tensor as the generator yields it: an args read that raises leaves the
    # earlier ones bumped (the error itself is SystemError or the read's
    # exception, depending on CPython's specialisation of the call site; we
    # raise the latter). 2.13's generated call reads them into a tuple first
    # -> plan bit bump_from_generator.
    bump_from_generator: bool = False
    # --- inductor's CompiledFxGraph.__call__ (csrc/inductor/graph_call.c) ---
    # 2.13 on: each graph keeps its compile context for the autotune-cache
    # bundler (self._compile_context, entered on its first calls, then
    # None); 2.11/2.12 have none and call AutotuneCacheBundler.end_compile()
    # after every call -> GraphCall's compile_context.
    graph_call_compile_context: bool = True
    # 2.14 on: `if self.current_callable is None: raise AssertionError(msg)`
    # where 2.13 has a bare `assert` -> GraphCall's assert_message.
    graph_call_assert_message: str | None = None
    # --- Dynamo's compile_wrapper (csrc/dynamo/compile_wrapper.c) ---
    # What fullgraph=True does around the call. "raise" (2.13 on): the
    # nested-compile flag set from config and a compiled-frame count;
    # dynamo_tls.skip_reasons reset before the call; no compiled frame ->
    # RuntimeError naming the skip reasons (default stance), skip_reasons
    # None after. "warn" (2.12): the same flag and count, no skip reasons; no
    # compiled frame -> torch._dynamo.utils.warn_once(...) in any stance (the
    # binding's fullgraph_warn: that line as a frame of eval_frame.py, so the
    # warning is attributed where upstream's is). "override" (2.11):
    # set_eval_frame_override(_get_eval_frame_override()), restored after;
    # no count.
    compile_wrapper_fullgraph: str = "raise"
    # the compiler errors whose internal tracebacks are stripped include
    # UserError (2.12 on); 2.11's are Unsupported, UncapturedHigherOrderOpError
    compile_wrapper_strips_user_error: bool = True
    # 2.13 on: set_eval_frame_isolate_recompiles_id(self._isolate_recompiles_id)
    # before the call, the prior id restored after; 2.12 has no such id
    compile_wrapper_isolate_recompiles: bool = True
    # error_on_graph_break: 2.13 on sets it (and restores it after) only
    # where the current value differs; 2.12 always sets and restores it
    compile_wrapper_eog_where_differs: bool = True
    # 2.13 on: the local dispatch key sets saved before the call and put back
    # after (see compile_wrapper_cpp_key_stack for how); 2.12 leaves them
    compile_wrapper_saves_dispatch_keys: bool = True
    # 2.14 on: the local dispatch key set saved on a C++ thread-local stack
    # (torch._C._dynamo_save/restore_local_dispatch_key_set) where 2.13 enters
    # torch._C._ForceDispatchKeyGuard(include, exclude); and a nested eager
    # region (_is_eager_on_nested_compile) runs fn directly.
    compile_wrapper_cpp_key_stack: bool = False
    # 2.14 on: fx's tracing flag lives on a threading.local
    # (_is_fx_tracing_tls.flag, read by _get_is_fx_tracing) where 2.13 keeps
    # the module global _is_fx_tracing_flag
    fx_tracing_flag_tls: bool = False
    # install_generation_tagging_init's mark on nn.Module: through 2.14
    # "___needs_generation_tag_patch" = False; 2.15 "___has_generation_tag_patch"
    # = True, read for presence only (and GenerationTracker an instance of
    # _GenerationTracker, its generation an instance attribute)
    generation_tag_patch_attr: str = "___needs_generation_tag_patch"
    # ConfigModule._make_closure_patcher's change/revert (the enter hook of
    # dynamic=), csrc/config_patch.c: "var_marked" (2.13 on) sets
    # config[k].user_override (a ContextVar), then marks the hash and the
    # get-dict key dirty; "var" (2.12) sets self._config[k].user_override;
    # "attribute" (2.11) assigns self._config[k].user_override = v (a plain
    # attribute; prior read as config[k].user_override).
    config_patcher: str = "var_marked"
    # --- a config setting read per call (csrc/config_read.c) ---
    # ConfigModule.__getattr__: "var" (2.12 on) reads a ContextVar user
    # override, warns once on a deprecated setting and deep-copies every
    # default not of _IMMUTABLE_CONFIG_TYPES; "attribute" (2.11) reads the
    # override as a plain attribute, has no deprecation, and copies
    # list/set/dict defaults only -> _bind_config_read(attribute_overrides=).
    config_read: str = "var"
    # --- the pregraph bytecode hooks (csrc/dynamo/bytecode_helper.c) ---
    # the transformed bytecode calls torch._dynamo.utils.
    # record_pregraph_bytecode_enter/_exit (torch._disable_dynamo'd) on every
    # call; 2.15's calls them only under the profiler, undecorated and
    # skip-coded: nothing per call to replace
    pregraph_per_call: bool = True
    # CompiledFunction.backward takes the grads boxed (boxed_grads_call,
    # BackwardCFunction.apply_boxed, backward(ctx, grads_list): 2.13 on);
    # 2.11/2.12's reference CompiledFunction takes them unboxed
    # (backward(ctx, *flat_args), called by BackwardCFunction.apply) and runs
    # _backward_prologue_functional / _backward_epilogue_functional, which
    # the generated 2.13 prologue/epilogue do step for step
    # -> backward plan bit boxed_grads; no C apply_boxed; no C++ node.
    boxed_backward: bool = True
    # the double-backward guard: 2.13's generated backward tests only
    # torch.is_grad_enabled() when an input requires grad, and scans all_args
    # for a tensor requiring grad otherwise; 2.11/2.12 always scan
    # -> the backward plan's inputs_require_grad is False.
    double_backward_scans_args: bool = False
    # the compiled forward is called through call_func_at_runtime_with_args
    # (2.11/2.12), which warns and unpacks the args for an unboxed compiled
    # forward; 2.13's generated forward calls it with the list. The C forward
    # calls it boxed: an unboxed one keeps upstream's CompiledFunction.
    forward_checks_boxed_call: bool = False
    # The compiler wrappers whose post_compile returns a reference closure
    # (2.12: effect tokens, synthetic base, functionalized RNG) instead of a
    # generated function (2.13 on). 2.12's effect-tokens and RNG closures wrap
    # every compiled function, needed or not: _wrappers builds their C
    # objects from the closure cells (only passing the call on where there
    # are no tokens / no RNG functionalization); the synthetic base closure
    # (merge_view_inputs per call) and functionalized RNG stay upstream's,
    # counted.
    closure_compiler_wrappers: tuple[str, ...] = ()
    # The generated subclass wrapper and backward subclass functions are
    # compiled under a path Dynamo skips (2.13 on: f"{__file__}:codegen(...)");
    # 2.12 compiles them as "<name>", frames Dynamo's eval-frame hook may
    # intercept: our C objects have no frame, so on 2.12 the subclass wrapper
    # and CompiledFunction of subclass graphs stay upstream's, counted.
    subclass_wrapper_mirrored: bool = True
    # --- 2.11 against 2.12 ---
    # AOTDispatchAutograd.post_compile(spec) builds CompiledFunction through
    # _AOTDispatchAutogradFunctionFactory (2.12 on: its RNG bookkeeping in an
    # _AutogradRngStateTracker, the lazy backward compile in an
    # _AutogradBackwardCompiler). 2.11's post_compile takes the old positional
    # signature and builds the class inline: the RNG bookkeeping lives in the
    # closure of its forward/backward (graph-safe RNG states keep upstream's
    # class, counted), and its _backward_impl compiles the backward lazily
    # itself, reading CompiledFunction.compiled_bw on every call. We reach
    # 2.11's class through _create_runtime_wrapper, whose compiled_fn is its
    # `CompiledFunction.apply`; the C backward reads cls.compiled_bw per call
    # and runs upstream's _backward_impl for a call that finds it None (the
    # lazy compile) -> backward plan key lazy_backward_impl.
    compiled_function_factory: bool = True
    # torch.autograd._force_original_view_tracking.__enter__ sets the mode
    # again (2.12); 2.11's __enter__ is `pass` (only __init__ sets it)
    # -> runtime-wrapper plan bit view_replay_set_on_enter (read only with
    # view_replay_forced).
    original_view_tracking_sets_on_enter: bool = True
    # CompiledFunction.backward runs impl_fn as
    # functools.partial(ctx.run, impl_fn) when the engine stashed a
    # `context` in TLS (2.12 on); 2.11's backward has no such hook
    # -> backward plan bit tls_context.
    backward_runs_in_tls_context: bool = True
    # The OutputAliasInfo attribute deciding which user outputs' grads reach
    # the compiled backward (_backward_prologue_functional /
    # _codegen_backward_prologue): requires_grad_for_backward (2.12 on);
    # 2.11 has only requires_grad.
    surviving_grad_attr: str = "requires_grad_for_backward"
    # process_runtime_tangent(x, meta, tangent_idx, tangent_desc,
    # compile_id_str, tangent_stack_trace) (2.12 on: what its error names);
    # 2.11's takes (x, meta) and ViewAndMutationMeta has neither
    # compile_id_str nor tangent_source_stack_traces
    # -> backward plan bit tangent_context_args.
    tangent_error_context: bool = True
    # aot_autograd.py, a training compile downgraded to inference (no output
    # requires grad, no input requiring grad is mutated): 2.12 on keeps the
    # ViewAndMutationMeta (is_train=False on it); 2.11 builds a new one from
    # some of its fields, without grad_enabled_mutation, so a graph that
    # leaves grad mode changed gets None there (no epilogue sets it). A
    # compile-time difference the C path inherits (it reads the metadata it
    # gets); recorded for the tests.
    downgrade_keeps_grad_enabled_mutation: bool = True
    # --- the interpreters ---
    # The CPython minor versions (GIL builds) the release is verified on: of
    # those torch publishes wheels of the release for, each on which the whole
    # suite passed (docs/compatibility.md records when; one not yet run is left
    # out until it has); the gate is closed on any other (README's support
    # matrix is made from this).
    pythons: tuple[tuple[int, int], ...] = ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14))

    def __post_init__(self) -> None:
        # the registry exists exactly where the forward snapshots it; only a
        # list registry is restored through the setter
        if (self.external_objects_registry is not None) != self.snapshots_external_objects:
            raise ValueError("external_objects_registry goes with snapshots_external_objects")
        if self.external_objects_registry not in (None, "dict", "list"):
            raise ValueError(f"external_objects_registry {self.external_objects_registry!r}")
        if self.external_objects_setter is not None and self.external_objects_registry != "list":
            raise ValueError("external_objects_setter needs a list registry")
        if self.compile_wrapper_fullgraph not in ("raise", "warn", "override"):
            raise ValueError(f"compile_wrapper_fullgraph {self.compile_wrapper_fullgraph!r}")
        if self.config_patcher not in ("var_marked", "var", "attribute"):
            raise ValueError(f"config_patcher {self.config_patcher!r}")
        if self.config_read not in ("var", "attribute"):
            raise ValueError(f"config_read {self.config_read!r}")

    @property
    def name(self) -> str:
        return "%d.%d" % self.series


# 2.12: AOTAutograd before codegen (the fields after
# alias_translates_storage_offset); docs/compatibility.md "2.12".
_REL_212 = Release(
    series=(2, 12),
    pythons=((3, 10), (3, 11), (3, 12), (3, 13), (3, 14)),
    keeps_saved_graph_inputs=False,
    snapshots_external_objects=False,
    copies_backward_context=False,
    opaque_type_check="is_opaque_type",
    opaque_base="OpaqueBase",
    function_apply_is_base=False,
    source_capture_sink=None,
    disable_skips_none_callback=False,
    external_objects_registry=None,
    external_objects_setter=None,
    aggregates_runtime_wrapper_trace=False,
    has_input_grad_buffers=False,
    backward_compile_defers_gc=False,
    subclass_outputs_by_cursor=False,
    subclass_act_inputs="act_input_indices",
    tangent_fake_check_cpp=False,
    alias_translates_storage_offset=False,
    runtime_wrapper_generated=False,
    forces_original_view_tracking=True,
    dynamic_dims_attr="_dynamo_weak_dynamic_indices",
    leaf_mutation_checks_stream=True,
    invoker_checks_args_list=True,
    updated_alias_inline_check=True,
    boxed_backward=False,
    double_backward_scans_args=True,
    forward_checks_boxed_call=True,
    closure_compiler_wrappers=(
        "EffectTokensWrapper", "AOTSyntheticBaseWrapper", "FunctionalizedRngRuntimeWrapper",
    ),
    subclass_wrapper_mirrored=False,
    prologue_range_exited_on_error=True,
    bump_from_generator=True,
    graph_call_compile_context=False,
    compile_wrapper_fullgraph="warn",
    compile_wrapper_isolate_recompiles=False,
    compile_wrapper_eog_where_differs=False,
    compile_wrapper_saves_dispatch_keys=False,
    config_patcher="var",
)


VERIFIED: tuple[Release, ...] = (
    # 2.11: 2.12's runtime semantics but where its source differs (the 2.11
    # fields above; docs/compatibility.md "2.11 against 2.12"):
    # its dedupe and debug-assert wrappers are closures, compile_wrapper has
    # the eval-frame override, the dynamic= patcher assigns attributes.
    dataclasses.replace(
        _REL_212, series=(2, 11),
        closure_compiler_wrappers=_REL_212.closure_compiler_wrappers + (
            "AOTDedupeWrapper", "DebugAssertWrapper",
        ),
        compile_wrapper_fullgraph="override",
        compile_wrapper_strips_user_error=False,
        config_patcher="attribute",
        prologue_range_exited_on_error=False,
        opaque_base=None,
        compiled_function_factory=False,
        original_view_tracking_sets_on_enter=False,
        backward_runs_in_tls_context=False,
        surviving_grad_attr="requires_grad",
        tangent_error_context=False,
        downgrade_keeps_grad_enabled_mutation=False,
        config_read="attribute",
        pythons=((3, 10), (3, 11), (3, 12), (3, 13), (3, 14)),
    ),
    _REL_212,
    Release(
        series=(2, 13),
        pythons=((3, 10), (3, 11), (3, 12), (3, 13), (3, 14)),
        keeps_saved_graph_inputs=False,
        snapshots_external_objects=False,
        copies_backward_context=False,
        opaque_type_check="is_opaque_type",
        opaque_base="OpaqueBase",
        function_apply_is_base=False,
        source_capture_sink=None,
        disable_skips_none_callback=False,
        external_objects_registry=None,
        external_objects_setter=None,
        aggregates_runtime_wrapper_trace=False,
        has_input_grad_buffers=False,
        backward_compile_defers_gc=False,
        subclass_outputs_by_cursor=False,
        subclass_act_inputs="act_input_indices",
        tangent_fake_check_cpp=False,
        alias_translates_storage_offset=False,
    ),
    Release(
        series=(2, 14),
        pythons=((3, 10), (3, 11), (3, 12), (3, 13), (3, 14)),
        keeps_saved_graph_inputs=True,
        snapshots_external_objects=True,
        copies_backward_context=True,
        opaque_type_check="is_custom_class",
        opaque_base="CustomClassBase",
        function_apply_is_base=True,
        source_capture_sink="torch._functorch._aot_autograd.codegen:_current_capture_sink",
        disable_skips_none_callback=True,
        external_objects_registry="dict",
        external_objects_setter=None,
        aggregates_runtime_wrapper_trace=False,
        has_input_grad_buffers=False,
        backward_compile_defers_gc=False,
        subclass_outputs_by_cursor=True,
        subclass_act_inputs="act_input_paths",
        tangent_fake_check_cpp=True,
        alias_translates_storage_offset=True,
        graph_call_assert_message="self.current_callable must not be None",
        compile_wrapper_cpp_key_stack=True,
        fx_tracing_flag_tls=True,
    ),
    Release(
        series=(2, 15),
        keeps_saved_graph_inputs=True,
        snapshots_external_objects=True,
        copies_backward_context=True,
        opaque_type_check="is_custom_class",
        opaque_base="CustomClassBase",
        function_apply_is_base=True,
        source_capture_sink="torch._functorch._aot_autograd.codegen:_current_capture_sink",
        disable_skips_none_callback=True,
        external_objects_registry="list",
        external_objects_setter="set_external_object_by_index",
        aggregates_runtime_wrapper_trace=True,
        has_input_grad_buffers=True,
        backward_compile_defers_gc=True,
        subclass_outputs_by_cursor=True,
        subclass_act_inputs="act_input_paths",
        tangent_fake_check_cpp=True,
        alias_translates_storage_offset=True,
        graph_call_assert_message="self.current_callable must not be None",
        compile_wrapper_cpp_key_stack=True,
        fx_tracing_flag_tls=True,
        generation_tag_patch_attr="___has_generation_tag_patch",
        pregraph_per_call=False,
        pythons=((3, 11), (3, 12), (3, 13), (3, 14), (3, 15)),
    ),
)

# Releases read and mirrored, not verified: the gate stays closed on them;
# the TORCH_AOT_RT_UNVERIFIED=1 opt-in uses the entry of the running series.
# 2.11 was one until the whole suite passed there; none now.
CANDIDATES: tuple[Release, ...] = ()

UNVERIFIED_ENV = "TORCH_AOT_RT_UNVERIFIED"

# A final release, optionally with a local build tag (2.14.1+cu130). Pre-
# releases and source builds (2.15.0a0+git...) are not the verified source.
_FINAL = re.compile(r"^(\d+)\.(\d+)\.(\d+)(\+[0-9A-Za-z.]+)?$")
_SERIES = re.compile(r"^(\d+)\.(\d+)")


def _opted_in() -> bool:
    return os.environ.get(UNVERIFIED_ENV, "").strip().lower() in ("1", "true", "on", "yes")


def build_kind() -> str:
    """What the running interpreter is, as far as the gate asks: "default"
    (a CPython release build with the GIL), "free-threaded"
    (Py_GIL_DISABLED: loading our C extension would switch the GIL back
    on), "debug" (Py_DEBUG), or the implementation's name (PyPy, ...)."""
    import sysconfig

    if sys.implementation.name != "cpython":
        return sys.implementation.name
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "free-threaded"
    if hasattr(sys, "gettotalrefcount"):
        return "debug"
    return "default"


VERIFIED_BUILD_KIND = "default"


def python_name(python: tuple[int, int]) -> str:
    return "%d.%d" % python


@dataclass(frozen=True)
class Gate:
    torch_version: str
    release: Release | None    # the semantics the C path runs with, or None
    verified: bool
    unverified_opt_in: bool
    python: tuple[int, int] = sys.version_info[:2]
    kind: str = VERIFIED_BUILD_KIND
    # why the C path does not run here (torch release, interpreter), or None
    why: str | None = None

    @property
    def reason(self) -> str | None:
        """Why every compile falls back, or None."""
        if self.why is not None:
            return self.why
        if self.release is None:
            return f"torch {self.torch_version} is not a verified version"
        return None

    @property
    def loads_extension(self) -> bool:
        """Whether our C extension may be loaded at all: never into an
        interpreter of another build kind (a free-threaded one would switch
        its GIL on), whatever the opt-in says."""
        return self.kind == VERIFIED_BUILD_KIND


def resolve(torch_version: str, python: tuple[int, int] | None = None,
            kind: str | None = None) -> Gate:
    """The gate for this torch version, CPython minor version and build kind
    (the running interpreter's by default) and environment."""
    python = tuple(python or sys.version_info[:2])
    kind = kind or build_kind()
    if kind != VERIFIED_BUILD_KIND:
        what = "a free-threaded build" if kind == "free-threaded" else f"a {kind} build"
        return Gate(torch_version, None, False, False, python, kind,
                    f"{what} of Python {python_name(python)} is not supported "
                    "(the C extension is not loaded there)")
    gate = _resolve_torch(torch_version, python, kind)
    if gate.release is None or python in gate.release.pythons:
        return gate
    if _opted_in():
        return dataclasses.replace(gate, verified=False, unverified_opt_in=True)
    verified = ", ".join(python_name(p) for p in gate.release.pythons)
    return Gate(torch_version, None, False, False, python, kind,
                f"Python {python_name(python)} is not verified with torch "
                f"{gate.release.name} (verified: {verified})")


def _resolve_torch(torch_version: str, python: tuple[int, int], kind: str) -> Gate:
    if _FINAL.match(torch_version):
        series = tuple(int(x) for x in _SERIES.match(torch_version).groups())
        for release in VERIFIED:
            if release.series == series:
                return Gate(torch_version, release, True, False, python, kind)
    if not _opted_in():
        return Gate(torch_version, None, False, False, python, kind)
    # At the user's own risk: the newest entry not newer than this torch
    # (the oldest for anything older, the newest for anything unparsable), or
    # the candidate entry of its series.
    m = _SERIES.match(torch_version)
    nearest = VERIFIED[-1]
    if m is not None:
        series = (int(m.group(1)), int(m.group(2)))
        for release in CANDIDATES:
            if release.series == series:
                return Gate(torch_version, release, False, True, python, kind)
        older = [r for r in VERIFIED if r.series <= series]
        nearest = older[-1] if older else VERIFIED[0]
    return Gate(torch_version, nearest, False, True, python, kind)


def verified_pairs() -> list[tuple[str, str]]:
    """Every (torch series, CPython minor) pair the gate opens on, as
    ("2.15", "3.12"), release by release."""
    return [(r.name, python_name(p)) for r in VERIFIED for p in r.pythons]


def support_matrix() -> str:
    """The support matrix as a Markdown table (README's is this, checked by
    a test): torch series by CPython minor version, verified or not."""
    pythons = sorted({p for r in VERIFIED for p in r.pythons})
    head = "| torch \\ CPython | " + " | ".join(python_name(p) for p in pythons) + " |"
    rule = "|---|" + "---|" * len(pythons)
    rows = [
        f"| {r.name} | " + " | ".join("verified" if p in r.pythons else "inactive"
                                      for p in pythons) + " |"
        for r in VERIFIED
    ]
    note = ("Any other torch release or CPython version, and free-threaded builds "
            "(3.13t, 3.14t, 3.15t): inactive (the import changes nothing and warns once).")
    return "\n".join([head, rule] + rows + ["", note])
