"""The one place that names torch internals: installs our builders in place of
upstream's ``_create_runtime_wrapper`` and ``AOTDispatchAutograd.post_compile``.

``RuntimeWrapper.post_compile`` looks ``_create_runtime_wrapper`` up as a module
global on every compile, and it is the single place that ``torch.compile``,
``aot_function``/``aot_module`` and AOTAutogradCache hits all go through, in both
the inference and the training path. So replacing that global is the whole
drop-in. The replacement decides per compile: C wrapper, or upstream's own.
"""

from __future__ import annotations

import functools
import threading

_install_lock = threading.Lock()
_installed: dict = {}


def _runtime_wrappers_module():
    # torch._functorch._aot_autograd.runtime_wrappers cannot be imported first
    # (circular import through torch._dynamo); importing torch._dynamo first is
    # what torch itself does.
    import torch._dynamo  # noqa: F401
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    return rw


def bind_error() -> str | None:
    """Why the C runtime cannot run on this torch, or None."""
    return _installed.get("bind_error")


def install() -> None:
    """Install our builders. Never raises for a torch whose internals differ:
    the C path is then unavailable and every compile falls back, counted."""
    with _install_lock:
        if _installed:
            return
        rw = _runtime_wrappers_module()
        from . import _C, _autograd_plan, _plan, is_enabled

        try:
            _C._bind_torch()
        except Exception as e:  # an internal missing in this torch version
            _installed["bind_error"] = f"torch internals differ: {e!r}"

        upstream = rw._create_runtime_wrapper

        @functools.wraps(upstream)
        def _create_runtime_wrapper(compiled_fn, **kwargs):
            if not is_enabled():
                return upstream(compiled_fn, **kwargs)
            return _plan.build_runtime_wrapper(upstream, compiled_fn, **kwargs)

        _installed["upstream"] = upstream
        _installed["ours"] = _create_runtime_wrapper
        rw._create_runtime_wrapper = _create_runtime_wrapper

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
        ours = _installed.get("ours_post_compile")
        if ours is not None and rw.AOTDispatchAutograd.__dict__["post_compile"].__func__ is ours:
            rw.AOTDispatchAutograd.post_compile = staticmethod(
                _installed["upstream_post_compile"]
            )
        _installed.clear()
