"""The installer: the one module that decides whether anything of torch's is
replaced, and replaces it, in order.

What we put in place of upstream's, each where all its callers find it:

- ``AOTDispatchSubclassWrapper.post_compile`` (``_subclass_wrapper``: the generated
  subclass unwrap/wrap around the compiled graph);
- ``runtime_wrappers._create_runtime_wrapper`` (a module global that
  ``RuntimeWrapper.post_compile`` looks up on every compile: the one place
  ``torch.compile``, ``aot_function``/``aot_module`` and AOTAutogradCache hits
  all go through, inference and training) -> ``_plan.build_runtime_wrapper``;
- ``AOTDispatchAutograd.post_compile`` (builds CompiledFunction) ->
  ``_autograd_plan.build_autograd_post_compile`` (2.11, whose post_compile
  builds the class inline: ``build_inline_post_compile``, upstream's with its
  metadata noted, the class adopted in ``_create_runtime_wrapper``);
- Dynamo's ``GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS`` (``_saved_hooks_guard``),
  ``SerializableCompiledFunction.__init__`` (``_serializable_call``),
  ``aot_autograd.simple_wraps`` (``_params_prepend``) and the ``post_compile`` of
  the dedupe, synthetic-base, effect-token, functionalized-RNG,
  fakified-output and debug-assert wrappers (``_wrappers``);
- and, bound rather than replaced, what the C version of
  ``torch._dynamo.disable``'s wrapper reads (``_disable``).

The gate comes first. The C path runs only on a torch whose release has an
entry in ``_versions`` and whose mirrored code has that entry's fingerprints
(``_mirrored``), and whose internals bind; otherwise nothing at all is
replaced (the import says so once, as an :class:`~torch_aot_rt.InactiveWarning`)
and torch runs exactly as without us. With the ``TORCH_AOT_RT_UNVERIFIED=1``
opt-in the fingerprints are not required, but every replacement still checks
the shape of what it replaces first.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import warnings

from . import _state

_install_lock = threading.Lock()


class InactiveWarning(UserWarning):
    """``import torch_aot_rt`` changed nothing: the C path does not run on this torch."""


def _runtime_wrappers_module():
    # torch._functorch._aot_autograd.runtime_wrappers cannot be imported first
    # (circular import through torch._dynamo); importing torch._dynamo first is
    # what torch itself does.
    import torch._dynamo  # noqa: F401
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    return rw


def _shape(fn) -> tuple:
    """A callable's parameters, by name and kind (annotations aside)."""
    return tuple((p.name, p.kind.name) for p in inspect.signature(fn).parameters.values())


_KW = "KEYWORD_ONLY"
# The shapes our replacements are called with, on every verified release.
_RUNTIME_WRAPPER_SHAPE = (
    ("compiled_fn", "POSITIONAL_OR_KEYWORD"), ("runtime_metadata", _KW),
    ("indices_of_inps_to_detach", _KW), ("trace_joint", _KW),
    ("keep_input_mutations", _KW), ("disable_amp", _KW),
)
_POST_COMPILE_SHAPE = (("spec", "POSITIONAL_OR_KEYWORD"),)
_PK = "POSITIONAL_OR_KEYWORD"
# 2.11's post_compile, which builds CompiledFunction inline (not replaced:
# its class is reached from _create_runtime_wrapper)
_INLINE_POST_COMPILE_SHAPE = tuple(
    (name, _PK) for name in (
        "compiled_fw_func", "compiled_bw_func", "maybe_subclass_meta",
        "num_symints_saved_for_bw_", "backward_state_indices", "disable_amp",
        "indices_of_inps_to_detach", "lazy_backward_info", "aot_config",
    )
) + (("fw_metadata", _KW), ("try_save_cache_entry", _KW))
_WRAPPER_POST_COMPILE_SHAPE = (
    ("self", "POSITIONAL_OR_KEYWORD"), ("compiled_fn", "POSITIONAL_OR_KEYWORD"),
    ("aot_config", "POSITIONAL_OR_KEYWORD"), ("runtime_metadata", _KW),
)


def _codes(code):
    """A code object and the code objects nested in it, recursively."""
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_consts"):
            yield from _codes(c)


def _check_release(rw, rel) -> None:
    """What a release entry states and can be checked, checked: a torch that
    does not match its entry is one we were not verified against."""
    import torch
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta
    from torch.autograd.function import Function

    apply_is_base = Function.__dict__.get("apply") is torch._C._FunctionBase.__dict__["apply"]
    if apply_is_base != rel.function_apply_is_base:
        raise RuntimeError(
            f"Function.apply is{'' if apply_is_base else ' not'} _FunctionBase.apply, "
            f"unlike torch {rel.name}"
        )
    fields = getattr(ViewAndMutationMeta, "__dataclass_fields__", {})
    if ("saved_tensor_is_graph_input" in fields) != rel.keeps_saved_graph_inputs:
        raise RuntimeError(
            f"ViewAndMutationMeta.saved_tensor_is_graph_input differs from torch {rel.name}"
        )
    rw._FirstInvocationContext  # noqa: B018 (on every verified release)
    from torch.autograd.function import BackwardCFunction

    boxed = hasattr(BackwardCFunction, "apply_boxed")
    if boxed != rel.boxed_backward:
        raise RuntimeError(
            f"BackwardCFunction.apply_boxed is{'' if boxed else ' not'} there, "
            f"unlike torch {rel.name}"
        )
    generated = hasattr(rw, "_codegen_epilogue")
    if generated != rel.runtime_wrapper_generated:
        raise RuntimeError(
            f"runtime_wrappers._codegen_epilogue is{'' if generated else ' not'} there, "
            f"unlike torch {rel.name}"
        )
    registry = rw.__dict__.get("index_to_external_object_weakref")
    kind = None if registry is None else type(registry).__name__
    if kind != rel.external_objects_registry:
        raise RuntimeError(
            f"runtime_wrappers.index_to_external_object_weakref is {kind}, "
            f"unlike torch {rel.name}'s {rel.external_objects_registry}"
        )
    if rel.external_objects_setter is not None:
        getattr(rw, rel.external_objects_setter)  # AttributeError: not this release
    try:  # 2.14 on
        from torch._functorch._aot_autograd import codegen
    except ImportError:
        codegen = None
    aggregates = hasattr(codegen, "aggregate_runtime_wrapper_sources")
    if aggregates != rel.aggregates_runtime_wrapper_trace:
        raise RuntimeError(
            f"codegen.aggregate_runtime_wrapper_sources is{'' if aggregates else ' not'} "
            f"there, unlike torch {rel.name}"
        )
    if aggregates:  # what _trace.log_plan calls
        codegen._current_trace_sink  # noqa: B018
        codegen._trace_runtime_wrapper_sources  # noqa: B018
    buffers = hasattr(torch._C._FunctionBase, "_input_grad_buffers")
    if buffers != rel.has_input_grad_buffers:
        raise RuntimeError(
            f"_FunctionBase._input_grad_buffers is{'' if buffers else ' not'} there, "
            f"unlike torch {rel.name}"
        )
    compiler = rw.__dict__.get("_AutogradBackwardCompiler")
    defers = any(
        "deferred_full_gc" in code.co_names
        for code in _codes(
            compiler.get_or_compile.__code__ if compiler is not None
            # 2.11: the lazy compile inline in CompiledFunction._backward_impl
            else rw.AOTDispatchAutograd.post_compile.__code__
        )
    )
    if defers != rel.backward_compile_defers_gc:
        raise RuntimeError(
            f"the lazy backward compile does{'' if defers else ' not'} defer full GCs, "
            f"unlike torch {rel.name}"
        )
    _check_compiled_function(rw, rel)
    # the core pair is replaced together or not at all
    autograd = rw.__dict__["AOTDispatchAutograd"]
    factory = rel.compiled_function_factory
    for what, fn, shape in (
        ("_create_runtime_wrapper", rw._create_runtime_wrapper, _RUNTIME_WRAPPER_SHAPE),
        ("AOTDispatchAutograd.post_compile", autograd.post_compile,
         _POST_COMPILE_SHAPE if factory else _INLINE_POST_COMPILE_SHAPE),
        ("RuntimeWrapper.post_compile", rw.RuntimeWrapper.post_compile,
         _WRAPPER_POST_COMPILE_SHAPE),
    ):
        if _shape(fn) != shape:
            raise RuntimeError(f"{what}{inspect.signature(fn)} is not the verified signature")
    if not isinstance(autograd.__dict__.get("post_compile"), staticmethod):
        raise RuntimeError("AOTDispatchAutograd.post_compile is not a staticmethod")
    if factory:
        rw._AOTDispatchAutogradFunctionFactory.build  # noqa: B018
    elif not any(
        getattr(c, "co_name", None) == "CompiledFunction"
        for c in autograd.post_compile.__code__.co_consts
    ):
        raise RuntimeError("AOTDispatchAutograd.post_compile does not build CompiledFunction")


def _check_compiled_function(rw, rel) -> None:
    """The CompiledFunction-related claims of a release entry (2.11 against 2.12)."""
    import torch
    from torch._functorch._aot_autograd.schemas import OutputAliasInfo

    factory = hasattr(rw, "_AOTDispatchAutogradFunctionFactory")
    if factory != rel.compiled_function_factory:
        raise RuntimeError(
            f"runtime_wrappers._AOTDispatchAutogradFunctionFactory is"
            f"{'' if factory else ' not'} there, unlike torch {rel.name}"
        )
    if rel.surviving_grad_attr not in getattr(OutputAliasInfo, "__dataclass_fields__", {}):
        raise RuntimeError(
            f"OutputAliasInfo has no {rel.surviving_grad_attr}, unlike torch {rel.name}"
        )
    params = inspect.signature(rw.AOTDispatchAutograd.process_runtime_tangent).parameters
    if ("tangent_idx" in params) != rel.tangent_error_context:
        raise RuntimeError(
            f"process_runtime_tangent{inspect.signature(rw.AOTDispatchAutograd.process_runtime_tangent)}"
            f" is not torch {rel.name}'s"
        )
    if rel.forces_original_view_tracking:
        enter = torch.autograd._force_original_view_tracking.__enter__.__code__
        sets = "_set_view_replay_enabled" in enter.co_names
        if sets != rel.original_view_tracking_sets_on_enter:
            raise RuntimeError(
                f"_force_original_view_tracking.__enter__ does{'' if sets else ' not'} set "
                f"view replay, unlike torch {rel.name}"
            )


def _source_capture_sink(rel):
    import importlib

    module, name = rel.source_capture_sink.split(":")
    return getattr(importlib.import_module(module), name)


def _gate_reason(torch, gate) -> str | None:
    """Why the C path must not run on this torch (before anything of it is
    imported beyond ``torch`` itself), or None."""
    from . import _fingerprints, _mirrored

    if gate.reason is not None:
        return gate.reason
    if gate.unverified_opt_in:
        return None
    expected = _fingerprints.FINGERPRINTS.get(gate.release.name)
    if expected is None:
        return f"torch {gate.release.name} has no recorded fingerprints"
    why = _mirrored.mismatch(expected, os.path.dirname(torch.__file__))
    if why is not None:
        return f"torch {gate.torch_version} is not the verified {gate.release.name} source: {why}"
    return None


def _extension_reason() -> str | None:
    """Why our C extension cannot be loaded into this interpreter, or None
    (it is then loaded). Asked only where the gate is open."""
    try:
        from . import _C  # noqa: F401
    except ImportError as e:
        return f"torch_aot_rt's C extension does not load: {e}"
    return None


def _bind(rw, rel) -> None:
    """Check the release entry against this torch and bind the C core to it
    (and the C++ part, where built for this torch). Raises when they differ."""
    import torch

    from . import _C, _cpp

    _check_release(rw, rel)
    if rel.source_capture_sink is not None:
        _state.installed["capture_sink"] = _source_capture_sink(rel)
    capsule, cpp_module, cpp_reason = _cpp.load(torch)
    _C._bind_torch(
        opaque_type_check=rel.opaque_type_check,
        opaque_base=rel.opaque_base,
        external_objects=(
            "index_to_external_object_weakref"
            if rel.snapshots_external_objects
            else None
        ),
        external_objects_type=rel.external_objects_registry,
        external_objects_setter=rel.external_objects_setter,
        input_grad_buffers=rel.has_input_grad_buffers,
        cpp=capsule,
    )
    _state.installed["cpp"] = (cpp_module, cpp_reason)
    import torch.utils._config_module as config_module

    _C._bind_config_read(config_module.ConfigModule,
                         attribute_overrides=rel.config_read == "attribute")


def _close(torch, reason: str) -> None:
    from . import _cpp

    _state.installed["closed"] = reason
    _state.installed.pop("capture_sink", None)
    absent = _cpp.absence_reason(torch)
    _state.installed["cpp"] = (None, absent or f"the C path is off: {reason}")
    warnings.warn(
        f"torch_aot_rt is inactive: {reason}. torch runs exactly as without it "
        "(torch_aot_rt.stats()['torch'] says why; docs/compatibility.md lists the "
        "verified releases).",
        InactiveWarning,
        stacklevel=4,
    )


def _replace_runtime(rw) -> list:
    """The core pair: the runtime-wrapper builder and CompiledFunction's."""
    from . import _autograd_plan, _plan

    upstream = rw._create_runtime_wrapper
    # 2.11: post_compile builds CompiledFunction inline and hands its apply to
    # the runtime wrapper, where the class is adopted.
    inline = not _state.release().compiled_function_factory

    @functools.wraps(upstream)
    def _create_runtime_wrapper(compiled_fn, **kwargs):
        if not _state.is_enabled():
            return upstream(compiled_fn, **kwargs)
        if inline and kwargs.get("trace_joint"):
            compiled_fn = _autograd_plan.adopt_inline_class(compiled_fn)
        return _plan.build_runtime_wrapper(upstream, compiled_fn, **kwargs)

    _state.installed["upstream"] = upstream
    replaced = [_state.replace(rw, "_create_runtime_wrapper", _create_runtime_wrapper)]
    autograd = rw.AOTDispatchAutograd
    upstream_post_compile = autograd.post_compile

    if inline:
        # upstream's, marking the class it builds as the one to adopt
        @functools.wraps(upstream_post_compile)
        def post_compile(*args, **kwargs):
            if not _state.is_enabled():
                return upstream_post_compile(*args, **kwargs)
            return _autograd_plan.build_inline_post_compile(upstream_post_compile, args, kwargs)
    else:
        @functools.wraps(upstream_post_compile)
        def post_compile(spec):
            if not _state.is_enabled():
                return upstream_post_compile(spec)
            return _autograd_plan.build_autograd_post_compile(upstream_post_compile, spec)

    _state.installed["upstream_post_compile"] = upstream_post_compile
    return replaced + [_state.replace(autograd, "post_compile", staticmethod(post_compile))]


def _replace_layers(rw) -> list:
    """The other per-call layers; each checks what it replaces and leaves it
    upstream's, counted, when it is not the verified one."""
    import torch._functorch.aot_autograd as aot_autograd

    from . import (
        _bytecode_helper, _compile_wrapper, _disable, _graph_call, _params_prepend,
        _saved_hooks_guard, _serializable_call, _subclass_wrapper, _wrappers,
    )

    replaced = []
    for name, install, arg in (
        ("saved-tensors-hooks guard", _saved_hooks_guard.install, None),
        ("bytecode helpers", _bytecode_helper.install, "release"),
        ("compiled graphs' disable wrapper", _disable.install_graph_globals, None),
        ("inductor's CompiledFxGraph.__call__", _graph_call.install, None),
        ("Dynamo's compile_wrapper", _compile_wrapper.install, "release"),
        ("SerializableCompiledFunction", _serializable_call.install, rw),
        ("params prepend", _params_prepend.install, aot_autograd),
        ("compiler wrappers", _wrappers.install, rw),
        ("subclass wrapper", _subclass_wrapper.install, rw),
    ):
        try:
            if arg == "release":
                arg = _state.release()
            record = install() if arg is None else install(arg)
        except Exception as e:
            _state.count_fallback(f"{name}: {_state.internal_error(e)}")
            continue
        if isinstance(record, list):
            replaced.extend(record)
        elif isinstance(record, str):  # why it stays upstream's
            _state.count_fallback(f"{name}: {record}")
        elif record is not None:
            replaced.append(record)
    return replaced


def install() -> None:
    """Decide, once, whether the C path runs on this torch, and install it if
    so. Never raises for a torch whose internals differ or that is not
    verified: nothing is then replaced."""
    with _install_lock:
        if _state.installed:
            return
        import torch

        from . import _versions

        gate = _versions.resolve(str(torch.__version__))
        _state.installed["gate"] = gate
        _state.installed["replaced"] = []
        reason = _gate_reason(torch, gate)
        if reason is None:
            reason = _extension_reason()
        if reason is None:
            try:
                rw = _runtime_wrappers_module()
                _bind(rw, gate.release)
            except Exception as e:  # an internal missing or changed in this torch
                reason = f"torch internals differ: {e!r}"
        if reason is not None:
            _close(torch, reason)
            return

        from . import _disable

        try:
            _state.installed["disable"] = _disable.install(gate.release)
        except Exception as e:
            _state.installed["disable"] = _state.internal_error(e)
        replaced = _replace_runtime(rw) + _replace_layers(rw)
        _state.installed["replaced"] = replaced
        _skip_in_dynamo()


def _skip_in_dynamo() -> None:
    """Dynamo skips this package's frames as it skips the files of torch's
    that they stand in for (``_TorchDynamoContext.__call__``'s wrapper, the
    builders): a frame of ours that runs while its callback is set (a
    torch.compile inside a compiled region, compiled autograd's) is then
    run, not traced, as upstream's is."""
    import torch._dynamo.trace_rules as trace_rules

    trace_rules.add(__package__)


def uninstall() -> None:
    """Put upstream's attributes back (used by tests; ``disable()`` is the user API)."""
    with _install_lock:
        for record in reversed(_state.installed.get("replaced", ())):
            _state.restore(record)
        _state.installed.clear()
