"""The one place that names torch internals: installs our builders in place of
upstream's ``_create_runtime_wrapper``, ``AOTDispatchAutograd.post_compile``,
(through ``_guards``) Dynamo's ``GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS``,
(through ``_serializable``) ``SerializableCompiledFunction.__init__`` and
(through ``_prepend``) ``aot_autograd.simple_wraps``; and binds (through
``_disable``) what the C version of ``torch._dynamo.disable``'s wrapper reads.

``RuntimeWrapper.post_compile`` looks ``_create_runtime_wrapper`` up as a module
global on every compile, and it is the single place that ``torch.compile``,
``aot_function``/``aot_module`` and AOTAutogradCache hits all go through, in both
the inference and the training path. So replacing that global is the whole
drop-in. The replacement decides per compile: C wrapper, or upstream's own.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple

_install_lock = threading.Lock()
_installed: dict = {}


def _runtime_wrappers_module():
    # torch._functorch._aot_autograd.runtime_wrappers cannot be imported first
    # (circular import through torch._dynamo); importing torch._dynamo first is
    # what torch itself does.
    import torch._dynamo  # noqa: F401
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    return rw


class Replaced(NamedTuple):
    """A class or module attribute we put in place of upstream's (see :func:`replace`)."""

    owner: Any
    name: str
    upstream: Any
    ours: Any


def replace(owner: Any, name: str, ours) -> Replaced:
    """Set ``owner.name = ours``; the record :func:`restore` undoes."""
    replaced = Replaced(owner, name, owner.__dict__[name], ours)
    setattr(owner, name, ours)
    return replaced


def restore(replaced: Replaced) -> None:
    """Put upstream's attribute back, unless someone replaced ours since."""
    if replaced.owner.__dict__.get(replaced.name) is replaced.ours:
        setattr(replaced.owner, replaced.name, replaced.upstream)


def bind_error() -> str | None:
    """Why the C runtime cannot run on this torch, or None."""
    return _installed.get("bind_error")


def release():
    """The verified release (``_versions.Release``) whose semantics plans use."""
    return _installed["gate"].release


def disable_unavailable() -> str | None:
    """Why compiled backwards keep upstream's disable wrapper, or None."""
    return _installed.get("disable", bind_error() or "not installed")


def cpp():
    """``(module name, None)`` when the C++ part is in use, else ``(None, reason)``."""
    return _installed.get("cpp", (None, _installed.get("bind_error") or "not installed"))


def gate():
    """The ``_versions.Gate`` decided at install, or None before it."""
    return _installed.get("gate")


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
    defers = "deferred_full_gc" in rw._AutogradBackwardCompiler.get_or_compile.__code__.co_names
    if defers != rel.backward_compile_defers_gc:
        raise RuntimeError(
            f"the lazy backward compile does{'' if defers else ' not'} defer full GCs, "
            f"unlike torch {rel.name}"
        )


def _source_capture_sink(rel):
    import importlib

    module, name = rel.source_capture_sink.split(":")
    return getattr(importlib.import_module(module), name)


def source_capture_active() -> bool:
    """Whether upstream is capturing the generated runtime-wrapper source
    (``aot_autograd.compile_to_python``): the capture needs its wrappers."""
    rel = release()
    if rel is None or rel.source_capture_sink is None:
        return False
    return _installed["capture_sink"]() is not None


def install() -> None:
    """Install our builders. Never raises for a torch whose internals differ,
    or one not in the verified list: the C path is then unavailable and every
    compile falls back, counted."""
    with _install_lock:
        if _installed:
            return
        rw = _runtime_wrappers_module()
        import torch

        from . import _C, _autograd_plan, _cpp, _plan, _versions, is_enabled

        gate = _versions.resolve(str(torch.__version__))
        _installed["gate"] = gate
        if gate.release is None:
            _installed["bind_error"] = gate.reason
        else:
            rel = gate.release
            try:
                _check_release(rw, rel)
                if rel.source_capture_sink is not None:
                    _installed["capture_sink"] = _source_capture_sink(rel)
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
                _installed["cpp"] = (cpp_module, cpp_reason)
            except Exception as e:  # an internal missing or changed in this torch
                _installed["bind_error"] = f"torch internals differ: {e!r}"
            if "bind_error" not in _installed:
                from . import _disable

                try:
                    _installed["disable"] = _disable.install(rel)
                except Exception as e:
                    _installed["disable"] = f"torch internals differ: {e!r}"

        upstream = rw._create_runtime_wrapper

        @functools.wraps(upstream)
        def _create_runtime_wrapper(compiled_fn, **kwargs):
            if not is_enabled():
                return upstream(compiled_fn, **kwargs)
            return _plan.build_runtime_wrapper(upstream, compiled_fn, **kwargs)

        _installed["upstream"] = upstream
        _installed["ours"] = _create_runtime_wrapper
        rw._create_runtime_wrapper = _create_runtime_wrapper

        # Dynamo's saved-tensor-hooks guard, built per compiled frame
        from . import _guards

        _installed["guards"] = _guards.install()
        # SerializableCompiledFunction's per-call pass-through
        from . import _serializable

        _installed["serializable"] = _serializable.install(rw)
        # aot_module_simplified's params-prepending forward
        import torch._functorch.aot_autograd as aot_autograd

        from . import _prepend

        _installed["prepend"] = _prepend.install(aot_autograd)

        # AOTDispatchAutograd.post_compile builds CompiledFunction; graph_compile
        # and the AOTAutogradCache both call it through the class attribute.
        autograd = getattr(rw, "AOTDispatchAutograd", None)
        if autograd is None or not hasattr(autograd, "post_compile"):
            return
        upstream_post_compile = autograd.post_compile

        def post_compile(spec):
            if not is_enabled():
                return upstream_post_compile(spec)
            return _autograd_plan.build_autograd_post_compile(upstream_post_compile, spec)

        _installed["upstream_post_compile"] = upstream_post_compile
        _installed["ours_post_compile"] = post_compile
        autograd.post_compile = staticmethod(post_compile)


def uninstall() -> None:
    """Put upstream's builder back (used by tests; ``disable()`` is the user API)."""
    with _install_lock:
        if not _installed:
            return
        rw = _runtime_wrappers_module()
        if rw._create_runtime_wrapper is _installed["ours"]:
            rw._create_runtime_wrapper = _installed["upstream"]
        for key in ("guards", "serializable", "prepend"):
            if _installed.get(key) is not None:
                restore(_installed[key])
        ours = _installed.get("ours_post_compile")
        if ours is not None and rw.AOTDispatchAutograd.__dict__["post_compile"].__func__ is ours:
            rw.AOTDispatchAutograd.post_compile = staticmethod(
                _installed["upstream_post_compile"]
            )
        _installed.clear()
