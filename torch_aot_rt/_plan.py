"""ViewAndMutationMeta + wrapper config -> the plan the C runtime wrapper runs.

Mirrors the build-time half of upstream's ``_create_runtime_wrapper``
(``_RuntimeCompiledFnInvoker``, ``_RuntimeForwardEpilogue`` and the ``_codegen_*``
helpers): every branch that depends only on metadata is taken here, once, and
what is left is a flat description of small ints, bools and the few objects the
call needs. ``csrc/plan.c`` validates it and turns it into C arrays.

Whatever cannot be expressed in a plan returns upstream's own wrapper, counted
in ``torch_aot_rt.stats()`` with the reason.
"""

from __future__ import annotations

import functools

from . import _state
from ._kinds import (
    MUT_AS_STRIDED_FIRST,
    MUT_DATA,
    MUT_LEAF,
    MUT_LEAF_STREAM_ERROR,
    MUT_METADATA,
    MUT_SET,
    MUT_SKIP,
    MUT_STREAM_ERROR,
    OUT_ALIAS_OF_INPUT,
    OUT_ALIAS_OF_INTERMEDIATE,
    OUT_IS_INPUT,
    OUT_PASS,
)


class Unsupported(Exception):
    """The C path cannot run this compile; the message is the stats reason."""


def _torch_modules():
    import torch._functorch._aot_autograd.runtime_wrappers as rw
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd.schemas import OutputType

    return rw, functorch_config, OutputType


def _capture_slots(runtime_metadata, OutputType):
    """``_RuntimeForwardEpilogue.epilogue_args_idx``, deduplicated into slots.

    Returns (capture, order, slot_of): the input indices to capture, once
    each, in upstream's evaluation order; every read upstream makes, duplicates
    included (they matter only for an args list whose __getitem__ is Python);
    and a map from input index to its slot.
    """
    order = list(runtime_metadata.mutated_inp_runtime_indices)
    for info in runtime_metadata.output_info:
        if info.output_type in (OutputType.alias_of_input, OutputType.is_input):
            if not isinstance(info.base_idx, int):
                raise Unsupported("output aliases an input with a non-int base_idx")
            order.append(info.base_idx)
    slot_of: dict[int, int] = {}
    for idx in order:
        if not isinstance(idx, int):
            raise Unsupported("non-int mutated input index")
        slot_of.setdefault(idx, len(slot_of))
    return tuple(slot_of), tuple(order), slot_of


def _mutations(runtime_metadata, slot_of, release):
    """One (slot, kind, flags) per mutated runtime input: ``_apply_input_mutations``."""
    stream_indices = getattr(runtime_metadata, "mutated_inp_stream_indices", None)
    plan = []
    for i, inpt_idx in enumerate(runtime_metadata.mutated_inp_runtime_indices):
        on_stream = (
            stream_indices is not None
            and i < len(stream_indices)
            and stream_indices[i] is not None
        )
        meta = runtime_metadata.input_info[inpt_idx]
        slot = slot_of[inpt_idx]
        if not meta.mutates_data and not meta.mutates_metadata:
            plan.append((slot, MUT_SKIP, 0))
        elif meta.mutates_storage_metadata:
            plan.append((slot, MUT_SET, 0))
        elif meta.mutates_metadata and not meta.mutates_data:
            plan.append((slot, MUT_METADATA, 0))
        else:
            flags = MUT_AS_STRIDED_FIRST if meta.mutates_metadata else 0
            if meta.is_leaf:
                flags |= MUT_LEAF
                if on_stream and release.leaf_mutation_checks_stream:
                    flags |= MUT_LEAF_STREAM_ERROR
            elif on_stream:
                flags |= MUT_STREAM_ERROR
            plan.append((slot, MUT_DATA, flags))
    return tuple(plan)


def _replay_sequence(info, replay_views):
    """The ViewMeta list gen_alias_from_base would replay, or None when it
    would take another branch (decided by metadata and config only)."""
    vms = info.view_meta_sequence
    if not replay_views or vms is None:
        return None
    if any(vm.has_symbolic_inputs for vm in vms.sequence):
        return None
    return list(vms.sequence)


def _outputs(runtime_metadata, slot_of, OutputType, replay_views):
    """One entry per user output: the handlers of ``_replay_output_aliases``."""
    if runtime_metadata.num_outputs_aliased == 0:
        return None
    num_user_outputs = len(runtime_metadata.output_info)
    aliased_out_indices = runtime_metadata.aliased_out_indices
    plan = []
    for info in runtime_metadata.output_info:
        kind = info.output_type
        if kind in (
            OutputType.non_alias,
            OutputType.unsafe_view_alias,
            OutputType.custom_function_view,
        ):
            plan.append((OUT_PASS, 0, False, False, None))
        elif kind == OutputType.is_input:
            plan.append((OUT_IS_INPUT, slot_of[info.base_idx], False, False, None))
        elif kind == OutputType.alias_of_input:
            plan.append(
                (
                    OUT_ALIAS_OF_INPUT,
                    slot_of[info.base_idx],
                    False,
                    bool(info.requires_grad),
                    _replay_sequence(info, replay_views),
                )
            )
        elif kind in (
            OutputType.alias_of_intermediate,
            OutputType.alias_of_intermediate_save_as_output,
            OutputType.alias_of_intermediate_base_is_user_output,
        ):
            if kind == OutputType.alias_of_intermediate_base_is_user_output:
                base = info.base_idx
                unwrap_base = base in aliased_out_indices
            else:
                base = info.base_idx + num_user_outputs
                unwrap_base = False
            plan.append(
                (
                    OUT_ALIAS_OF_INTERMEDIATE,
                    base,
                    unwrap_base,
                    bool(info.requires_grad),
                    _replay_sequence(info, replay_views),
                )
            )
        else:
            raise Unsupported(f"unknown output type {kind!r}")
    return tuple(plan)


def _dynamic_dims(runtime_metadata):
    if not runtime_metadata.dynamic_outputs:
        return ()
    return tuple(
        (i, o.dynamic_dims)
        for i, o in enumerate(runtime_metadata.output_info)
        if o.dynamic_dims is not None
    )


def make_plan(compiled_fn, *, runtime_metadata, indices_of_inps_to_detach,
              trace_joint, keep_input_mutations, disable_amp, release=None):
    """Keyword arguments for ``_C.RuntimeWrapper``, or raise :class:`Unsupported`.
    ``release`` (a ``_versions.Release``): whose semantics; the installed one
    by default."""
    rw, functorch_config, OutputType = _torch_modules()
    meta = runtime_metadata
    if release is None:
        release = _state.release()
    try:
        if functorch_config.unlift_effect_tokens and len(meta.tokens) != 0:
            # Upstream raises at build time; let it.
            raise Unsupported("unlift_effect_tokens with effect tokens")
        capture, capture_order, slot_of = _capture_slots(meta, OutputType)
        bump = ()
        if keep_input_mutations:
            bump = tuple(meta.mutated_graph_handled_indices_seen_by_autograd)
        num_mutated = meta.num_mutated_inp_runtime_indices
        replay_views = bool(functorch_config.view_replay_for_aliased_outputs)
        plan = dict(
            trace_joint=bool(trace_joint),
            disable_amp=bool(disable_amp),
            capture=capture,
            capture_order=capture_order,
            bump=bump,
            detach=tuple(indices_of_inps_to_detach) if trace_joint else (),
            num_mutated=num_mutated,
            expected_outs=num_mutated + meta.num_outputs + meta.num_intermediate_bases,
            mutations=_mutations(meta, slot_of, release),
            outputs=_outputs(meta, slot_of, OutputType, replay_views),
            alias_translates_storage_offset=release.alias_translates_storage_offset,
            dynamic_dims=_dynamic_dims(meta),
            grad_enabled_mutation=meta.grad_enabled_mutation,
            first_invocation=rw._FirstInvocationContext(),
            disable_saved_tensors_hooks=bool(
                trace_joint and rw._should_disable_saved_tensors_hooks()
            ),
            # what the release's reference Python does where 2.13's
            # generated wrapper differs (_versions.Release)
            dynamic_dims_attr=release.dynamic_dims_attr,
            view_replay_forced=release.forces_original_view_tracking,
            view_replay_set_on_enter=release.original_view_tracking_sets_on_enter,
            args_list_check=release.invoker_checks_args_list,
            updated_alias_inline_check=release.updated_alias_inline_check,
            prologue_range_exited_on_error=release.prologue_range_exited_on_error,
            bump_from_generator=release.bump_from_generator,
        )
    except AttributeError as e:
        # An internal renamed or missing on this torch version.
        raise Unsupported(f"torch internals differ: {e}") from None
    return plan


SOURCE_CAPTURE = "runtime-wrapper source is being captured (aot_autograd.compile_to_python)"


def check_available() -> None:
    """Raise :class:`Unsupported` when no C wrapper may be built right now:
    torch unverified or its internals differ, or upstream is capturing the
    generated wrapper source (which only its own wrappers produce)."""
    if _state.closed() is not None:
        raise Unsupported(_state.closed())
    if _state.source_capture_active():
        raise Unsupported(SOURCE_CAPTURE)


def _c_wrapper(compiled_fn, plan):
    from . import _C

    rw, _, _ = _torch_modules()
    if not getattr(compiled_fn, "_boxed_call", False):
        compiled_fn = rw.make_boxed_func(compiled_fn)
    wrapper = _C.RuntimeWrapper(compiled_fn, **plan)
    # upstream: @simple_wraps(_inner_compiled_fn) on runtime_wrapper, and once
    # more around it when saved-tensor hooks are disabled.
    functools.update_wrapper(
        wrapper, compiled_fn, assigned=("__doc__", "__annotations__", "__type_params__")
    )
    # ... and keeps its own identity: the inner function, or the saved-tensor
    # hooks layer around it.
    name = "_runtime_wrapper" if plan["disable_saved_tensors_hooks"] else "runtime_wrapper"
    wrapper.__name__ = name
    wrapper.__qualname__ = f"_create_runtime_wrapper.<locals>.{name}"
    wrapper.__module__ = rw.__name__
    return wrapper


def build_runtime_wrapper(upstream, compiled_fn, **kwargs):
    """Our ``_create_runtime_wrapper``: the C wrapper, or upstream's with a reason.

    Nothing of ours raises into the user's compile: an exception while
    building (a torch whose internals are not the ones we read) is a counted
    fallback like any other."""
    from . import _trace

    try:
        check_available()
        plan = make_plan(compiled_fn, **kwargs)
        wrapper = _c_wrapper(compiled_fn, plan)
    except Unsupported as e:
        reason = str(e)
    except Exception as e:
        reason = _state.internal_error(e)
    else:
        # what upstream's codegen logs for TORCH_TRACE / tlparse, describing ours
        _trace.log_plan(plan)
        _state.count_built("runtime_wrappers")
        return wrapper
    _state.count_fallback(reason)
    return upstream(compiled_fn, **kwargs)
