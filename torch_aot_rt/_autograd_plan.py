"""AOTAutograd's CompiledFunction -> the plans of its C forward and backward.

Upstream's ``_AOTDispatchAutogradFunctionFactory.build`` still builds the class:
it carries every attribute that compiled autograd and AOTAutogradCache read
(``_aot_id``, ``metadata``, ``_lazy_backward_info``, ``_bw_prologue_fn``, ...).
We then replace its ``forward`` and ``backward`` with C callables whose plans
mirror the build-time half of ``_codegen_compiled_forward``,
``_AutogradSavedState``, the generated forward epilogue,
``_codegen_backward_prologue``, ``_backward_impl`` and
``_codegen_backward_epilogue``; and the runtime wrapper calls a C boxed
``apply`` instead of ``make_boxed_func(CompiledFunction.apply)``.

What the C path does not cover keeps upstream's class as built, counted in
``torch_aot_rt.stats()`` with the reason.
"""

from __future__ import annotations

import functools
import threading

from . import _state
from ._plan import Unsupported, check_available

TANGENT_STRIDES, TANGENT_MEMORY_FORMAT, TANGENT_PYTHON = 0, 1, 2


def _closure(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _span(s) -> tuple:
    if not isinstance(s, slice) or s.step not in (None, 1):
        raise Unsupported(f"saved-for-backward slice {s!r}")
    for bound in (s.start, s.stop):
        if bound is not None and not isinstance(bound, int):
            raise Unsupported(f"saved-for-backward slice {s!r}")
    return (s.start, s.stop)


def _forward_plan(cls, spec, rng_state, release) -> dict:
    from torch._functorch._aot_autograd.schemas import MutationType

    meta = spec.fw_metadata
    num_mut = meta.num_mutated_inp_runtime_indices
    metadata_wraps = tuple(
        i
        for i, idx in enumerate(meta.mutated_inp_runtime_indices)
        if meta.input_info[idx].mutates_metadata and not meta.input_info[idx].mutates_data
    )
    unsafe_views = ()
    if meta.num_unsafe_view_outputs > 0:
        unsafe_views = tuple(num_mut + idx for idx in meta.unsafe_view_out_indices)
    aliased = ()
    if meta.num_outputs_aliased > 0:
        aliased = tuple(num_mut + idx for idx in meta.aliased_out_indices)
    returns_meta = [
        x for x in meta.input_info if x.mutation_type == MutationType.MUTATED_OUT_GRAPH
    ] + list(meta.output_info)
    non_diff = tuple(
        i
        for i, m in enumerate(returns_meta)
        if i < num_mut + meta.num_outputs and not m.requires_grad
    )
    dynamic_saved = tuple(
        (int(idx), dims) for idx, dims in meta.dynamic_saved_tensors_idxs.items()
    )
    saved_is_graph_input = None
    if release.keeps_saved_graph_inputs:
        saved_is_graph_input = tuple(bool(b) for b in meta.saved_tensor_is_graph_input)
    return dict(
        compiled_fw=cls.compiled_fw,
        rng_add_forward_args=(
            rng_state.add_forward_args if rng_state is not None and rng_state.num_rng > 0
            else None
        ),
        backward_state_index=(
            spec.backward_state_indices[0] if spec.backward_state_indices else None
        ),
        disable_amp=bool(spec.disable_amp),
        num_forward_returns=meta.num_forward_returns,
        # _codegen_finalize checks these under config.debug_assert (read per call)
        debug_assert=(
            (
                num_mut,
                meta.num_outputs,
                sum(1 for x in meta.input_info if x.mutates_data or x.mutates_metadata),
                meta.num_outputs_aliased > 0,
            )
            if num_mut > 0 or meta.num_outputs_aliased > 0
            else None
        ),
        saved_vc=_span(meta.tensors_saved_for_backwards_with_vc_check_slice),
        saved_no_vc=_span(meta.tensors_saved_for_backwards_no_vc_check_slice),
        saved_symints=_span(meta.symints_saved_for_backwards_slice),
        saved_opaque=_span(meta.opaque_objects_saved_for_backwards_slice),
        dynamic_saved=dynamic_saved,
        saved_is_graph_input=saved_is_graph_input,
        dynamic_dims_attr=release.dynamic_dims_attr,
        snapshot_external_objects=release.snapshots_external_objects,
        external_objects_list=release.external_objects_registry == "list",
        metadata_mutation_wraps=metadata_wraps,
        unsafe_view_outputs=unsafe_views,
        aliased_outputs=aliased,
        non_differentiable=non_diff,
    )


def _tangent_plan(tangent_meta, desc, stack_trace) -> tuple:
    from torch._functorch._aot_autograd.schemas import PlainTensorMeta

    mf = getattr(tangent_meta, "memory_format", None)
    kind = TANGENT_PYTHON
    if type(tangent_meta) is PlainTensorMeta and mf:
        if mf.memory_format is not None:
            kind = TANGENT_MEMORY_FORMAT
        elif mf.size is not None and mf.stride is not None:
            kind = TANGENT_STRIDES
    return (
        kind,
        tangent_meta,
        getattr(mf, "size", None),
        getattr(mf, "stride", None),
        getattr(mf, "memory_format", None),
        desc,
        stack_trace,
    )


def _subclass_tangent_node(tangent_meta, release):
    """What the C backward needs to run ``process_runtime_tangent`` itself for
    a subclass tangent (csrc/aot/autograd/compiled_backward.c, subclass_tangent_leaves),
    or None (upstream's function runs): a SubclassCreationMeta of a tensor
    subclass (not a fake or functional tensor class) with a memory-format
    MemoryFormatMeta, whose inner tensors are plain ones with plain plans."""
    import torch
    from torch._functorch._aot_autograd.schemas import PlainTensorMeta, SubclassCreationMeta
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    if type(tangent_meta) is not SubclassCreationMeta:
        return None
    cls = tangent_meta.original_subclass_type
    if (not isinstance(cls, type) or not issubclass(cls, torch.Tensor) or cls is torch.Tensor
            or issubclass(cls, (FakeTensor, FunctionalTensor))):
        return None
    mf = tangent_meta.memory_format
    if not mf or getattr(mf, "memory_format", None) is None:
        return None
    attrs = []
    for name, attr_meta in tangent_meta.attrs.items():
        if not isinstance(name, str) or type(attr_meta) is not PlainTensorMeta:
            return None
        plan = _tangent_plan(attr_meta, None, None)
        if plan[0] == TANGENT_PYTHON:
            return None
        attrs.append((name, plan))
    is_fake = torch._C._is_fake_tensor if release.tangent_fake_check_cpp else None
    return (cls, tangent_meta.meta, mf.memory_format, is_fake, tuple(attrs))


def _backward_plan(cls, spec, rng_state, backward_compiler, lazy_backward_impl,
                   release) -> dict:
    import torch
    from torch._functorch._aot_autograd.schemas import OutputType

    meta = spec.fw_metadata
    num_mut = meta.num_mutated_inp_runtime_indices
    expected = meta.num_outputs + num_mut + meta.num_intermediate_bases
    # _codegen_backward_prologue: the grads that reach the compiled backward
    surviving = [
        i
        for i, idx in enumerate(meta.mutated_inp_runtime_indices)
        if meta.input_info[idx].mutates_data and meta.input_info[idx].requires_grad
    ]
    plain_kinds = (OutputType.non_alias, OutputType.unsafe_view_alias,
                   OutputType.custom_function_view)
    # requires_grad_for_backward (2.12 on), requires_grad (2.11)
    grad_attr = release.surviving_grad_attr
    surviving += [
        num_mut + i
        for i, info in enumerate(meta.output_info)
        if info.output_type in plain_kinds
        and issubclass(info.raw_type, torch.Tensor)
        and getattr(info, grad_attr)
    ]
    surviving += list(range(num_mut + meta.num_outputs, expected))
    tangent_metas = meta.subclass_tangent_meta
    descs = meta.traced_tangents_descs
    # what process_runtime_tangent's error names (2.12 on; 2.11 takes none)
    context_args = release.tangent_error_context
    stacks = (meta.tangent_source_stack_traces or ()) if context_args else ()
    if len(surviving) > min(len(tangent_metas), len(descs)):
        raise Unsupported("fewer tangent metas than grads")
    tangents = tuple(
        _tangent_plan(tangent_metas[j], descs[j], stacks[j] if stacks else None)
        for j in range(len(surviving))
    )
    # a subclass graph: the prologue chains each tangent's leaves and the
    # epilogue wraps the grads (_subclass_wrapper.grads_wrapper, in C)
    subclass = spec.maybe_subclass_meta
    grads_wrapper = None
    if subclass is not None:
        from . import _subclass_wrapper

        if not context_args:
            raise Unsupported(f"CompiledFunction: a subclass graph on torch {release.name}")
        if len(surviving) != len(tangent_metas):
            # upstream raises 'The grad inputs should be same number as forward
            # output tangents' on every backward: let it
            raise Unsupported("CompiledFunction: subclass tangents and their metas differ in number")
        grads_wrapper = _subclass_wrapper.grads_wrapper(subclass.grad_input_metas, release)
    nodes = tuple(
        _subclass_tangent_node(tangent_metas[j], release) if subclass is not None else None
        for j in range(len(surviving))
    )
    deterministic = meta.deterministic
    return dict(
        cls=cls,
        backward_compiler=backward_compiler,
        lazy_backward_impl=lazy_backward_impl,
        fw_metadata=meta,
        compile_id=meta.compile_id_str if context_args else None,
        rng_add_backward_args=(
            rng_state.add_backward_args if rng_state is not None and rng_state.num_rng > 0
            else None
        ),
        disable_amp=bool(spec.disable_amp),
        has_backward_state=bool(spec.backward_state_indices),
        check_deterministic=deterministic is not None and not deterministic,
        has_mutations_in_bw=bool(
            meta.indices_of_inputs_that_requires_grad_with_mutations_in_bw
        ),
        # _codegen_compiled_backward skips the scan of all_args for the
        # double-backward guard when an input requires grad; 2.11/2.12 scan always
        inputs_require_grad=(
            not release.double_backward_scans_args
            and any(inp.requires_grad for inp in meta.input_info)
        ),
        boxed_grads=release.boxed_backward,
        has_no_vc_check=bool(meta.num_tensors_saved_with_no_vc_check),
        restore_external_objects=release.snapshots_external_objects,
        restore_by_setter=release.external_objects_setter is not None,
        copy_context=release.copies_backward_context,
        tls_context=release.backward_runs_in_tls_context,
        tangent_context_args=context_args,
        expected_grad_outs=expected,
        num_backward_tokens=meta.num_backward_tokens,
        surviving=tuple(surviving),
        tangents=tangents,
        subclass_tangents=subclass is not None,
        grads_wrapper=grads_wrapper,
        subclass_tangent_nodes=nodes,
    )


def _node_allowed(cls, release) -> bool:
    """Whether calls may take the C++ autograd node (csrc/cpp/compiled_node.cpp),
    decided at build: the class's backward takes the grads as the release's
    node gives them (boxed, apply_boxed, where the class has boxed_grads_call:
    2.13 on; unboxed, ctx.apply(*grads), on 2.11/2.12) and the C++ part in use
    was built to call it so. Compiled autograd takes the node as it takes
    upstream's PyNode (csrc/cpp/compiled_node_compiled_autograd.cpp), a
    graph with a BackwardState input included. The rest is decided per
    call, where the C++ part is loaded."""
    from . import _cpp

    boxed = bool(release.boxed_backward)
    class_boxed = getattr(cls, "boxed_grads_call", False) is True
    return class_boxed == boxed and _cpp.node_backward_boxed() in (None, boxed)


def install_c_function(cls, spec, release):
    """Give ``cls`` C forward/backward; return the C boxed ``apply``.

    Raises :class:`Unsupported` before touching ``cls`` when the C path does
    not cover this graph.
    """
    from torch.autograd.function import BackwardCFunction, Function

    from . import _C

    meta = spec.fw_metadata
    if release.forward_checks_boxed_call and not getattr(cls.compiled_fw, "_boxed_call", False):
        # call_func_at_runtime_with_args warns and unpacks the args: let it
        raise Unsupported("CompiledFunction: an unboxed compiled forward")
    if spec.maybe_subclass_meta is not None and not release.subclass_wrapper_mirrored:
        raise Unsupported(
            f"CompiledFunction: a subclass graph on torch {release.name} "
            "(its subclass codegen is not mirrored)"
        )
    if meta.is_rng_op_functionalized:
        raise Unsupported("CompiledFunction: functionalized RNG ops")
    try:
        upstream_forward = cls.__dict__["forward"].__func__
        upstream_backward = cls.__dict__["backward"].__func__
        upstream_impl = cls.__dict__["_backward_impl"].__func__
        if release.compiled_function_factory:
            rng_state = _closure(upstream_forward)["rng_state"]
            backward_compiler = _closure(upstream_impl)["backward_compiler"]
            lazy_backward_impl = None
        else:
            # 2.11: the RNG bookkeeping is the closure of upstream's forward
            # and backward, the lazy backward compile inline in _backward_impl
            if meta.num_graphsafe_rng_states:
                raise Unsupported(
                    f"CompiledFunction: graph-safe RNG states on torch {release.name} "
                    "(their bookkeeping is the closure of upstream's forward/backward)"
                )
            rng_state = backward_compiler = None
            lazy_backward_impl = upstream_impl
        forward = _C.CompiledForward(
            upstream=upstream_forward, **_forward_plan(cls, spec, rng_state, release)
        )
        backward = _C.CompiledBackward(
            upstream=upstream_backward,
            **_backward_plan(cls, spec, rng_state, backward_compiler, lazy_backward_impl,
                             release),
        )
        apply = _C.FunctionApply(
            cls,
            apply_is_base=release.function_apply_is_base,
            node=_node_allowed(cls, release),
        )
    except (AttributeError, KeyError) as e:
        raise Unsupported(f"CompiledFunction: torch internals differ: {e!r}") from None
    # Function-like identity (name, qualname, signature via __wrapped__) of the
    # functions they stand for.
    functools.update_wrapper(forward, upstream_forward)
    functools.update_wrapper(backward, upstream_backward)
    apply._boxed_call = True
    # it stands for make_boxed_func(cls.apply), whose function has no docstring
    # (the runtime wrapper and aot_module_simplified's forward copy __doc__)
    apply.__doc__ = None
    # The engine calls ctx.apply_boxed(grads) (boxed_grads_call), whose Python
    # body is `self._get_user_fn()(self, *args)`: while cls.backward is ours and
    # vjp is not overridden, that is our backward, called from C.
    backward_cls = cls._backward_cls
    apply_boxed = None
    upstream_apply_boxed = getattr(BackwardCFunction, "apply_boxed", None)  # 2.13 on
    if release.boxed_backward and upstream_apply_boxed is not None and (
        getattr(backward_cls, "apply_boxed", None) is upstream_apply_boxed
    ):
        apply_boxed = _C.ApplyBoxed(backward, cls, Function.vjp, upstream_apply_boxed)
    # Only now, with everything built, is the class touched: a failure above
    # leaves it upstream's.
    cls.forward = staticmethod(forward)
    cls.backward = staticmethod(backward)
    if apply_boxed is not None:
        backward_cls.apply_boxed = apply_boxed
    return apply


def _adopt(cls, spec):
    """The C ``apply`` of upstream's freshly built class, or None: upstream's
    class stays as built, counted with the reason. An exception in ours (a
    torch whose internals are not the ones we read) is such a fallback."""
    try:
        apply = install_c_function(cls, spec, _state.release())
    except Unsupported as e:
        reason = str(e)
    except Exception as e:
        reason = "CompiledFunction: " + _state.internal_error(e)
    else:
        _state.count_built("autograd_functions")
        return apply
    _state.count_fallback(reason)
    return None


def build_autograd_post_compile(upstream_post_compile, spec):
    """Our ``AOTDispatchAutograd.post_compile`` (2.12 on).

    Upstream's own steps (building the class, the runtime wrapper around its
    apply) raise as upstream's would; an exception in ours keeps upstream's
    class, counted."""
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    try:
        # Whole-torch conditions (unverified release, source capture): the same
        # reason string as the runtime wrapper's, so one key counts both.
        check_available()
    except Unsupported as e:
        _state.count_fallback(str(e))
        return upstream_post_compile(spec)
    cls = rw._AOTDispatchAutogradFunctionFactory(spec).build()
    apply = _adopt(cls, spec)
    if apply is None:
        apply = cls.apply
    # upstream: RuntimeWrapper(...).post_compile(cls.apply, ...), which reaches
    # our _create_runtime_wrapper.
    return rw.RuntimeWrapper(
        indices_of_inps_to_detach=spec.indices_of_inps_to_detach,
        trace_joint=True,
        disable_amp=spec.disable_amp,
    ).post_compile(apply, spec.aot_config, runtime_metadata=spec.fw_metadata)


# 2.11 (Release.compiled_function_factory False): AOTDispatchAutograd.post_compile
# builds CompiledFunction inline and hands `CompiledFunction.apply` to
# RuntimeWrapper.post_compile, which reaches our _create_runtime_wrapper.
_INLINE_QUALNAME = "AOTDispatchAutograd.post_compile.<locals>.CompiledFunction"


def _inline_class(compiled_fn):
    """The CompiledFunction class whose unbound ``apply`` compiled_fn is, or None."""
    from torch.autograd.function import Function

    cls = getattr(compiled_fn, "__self__", None)
    if not (
        isinstance(cls, type)
        and issubclass(cls, Function)
        and cls.__qualname__ == _INLINE_QUALNAME
        # not overridden: a classmethod's function is Function's (2.13 and
        # older); 2.14 on, Function.apply is _FunctionBase's C classmethod,
        # which has no __func__
        and "apply" not in vars(cls)
        and getattr(compiled_fn, "__func__", None) is getattr(Function.apply, "__func__", None)
        and compiled_fn == cls.apply
    ):
        return None
    return cls


def _inline_spec(cls):
    """What 2.12's AOTDispatchAutogradCompileSpec holds that the plans read,
    from the class 2.11's post_compile built: its attributes and the closure
    of its forward (post_compile's arguments)."""
    import types

    fwd = _closure(cls.__dict__["forward"].__func__)
    return types.SimpleNamespace(
        fw_metadata=cls.metadata,
        maybe_subclass_meta=cls.maybe_subclass_metadata,
        backward_state_indices=fwd["backward_state_indices"],
        disable_amp=fwd["disable_amp"],
    )


# the fw_metadata of each 2.11 post_compile running in this thread, innermost last
_building = threading.local()


def build_inline_post_compile(upstream_post_compile, args, kwargs):
    """Our 2.11 ``AOTDispatchAutograd.post_compile``: upstream's, which builds
    CompiledFunction and hands its apply to RuntimeWrapper.post_compile (our
    _create_runtime_wrapper, adopt_inline_class). Only the class built by this
    very call is adopted: one built with the C path off, or captured and
    handed to the runtime-wrapper builder again, stays upstream's."""
    metas = _building.__dict__.setdefault("metas", [])
    metas.append(kwargs.get("fw_metadata"))
    try:
        return upstream_post_compile(*args, **kwargs)
    finally:
        metas.pop()


def adopt_inline_class(compiled_fn):
    """2.11: the runtime wrapper's compiled_fn is `CompiledFunction.apply` of
    the class post_compile has just built; give that class the C forward and
    backward and return the C apply (or compiled_fn, counted, where the C
    path does not cover it). Anything else is returned as it is."""
    cls = _inline_class(compiled_fn)
    metas = getattr(_building, "metas", None)
    if cls is None or not metas or cls.__dict__.get("metadata") is not metas[-1]:
        return compiled_fn
    try:
        check_available()
        spec = _inline_spec(cls)
    except Unsupported as e:
        _state.count_fallback(str(e))
        return compiled_fn
    except (AttributeError, KeyError) as e:
        _state.count_fallback(f"CompiledFunction: torch internals differ: {e!r}")
        return compiled_fn
    apply = _adopt(cls, spec)
    return compiled_fn if apply is None else apply
