"""Dynamo's saved-tensor-hooks guard with a C check (``_C.SavedHooksGuard``).

Upstream's ``GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS`` (torch/_dynamo/guards.py)
installs, on every compiled frame, a lambda guard whose Python closure calls
AOTAutograd's ``top_saved_tensors_hooks`` and ``saved_tensors_hooks_are_inlineable``
on every call. Ours builds the guard the same way (the same expected ids, the same
code parts and export info, the same ``add_lambda_guard`` call) with the C check
in place of the closure; the choice is made when the guard is built, like every
other plan: with the C path off, on an unverified torch, or when the builder or the
helpers are not the ones we were verified against, upstream's method runs, counted.
"""

from __future__ import annotations

import functools

# What upstream's builder method reads and calls (its code's names): a method
# that names anything else is not the one this mirrors.
_UPSTREAM_NAMES = frozenset(
    {
        "torch", "_functorch", "_aot_autograd", "utils", "top_saved_tensors_hooks",
        "saved_tensors_hooks_are_inlineable", "_set_guard_export_info", "guard_manager",
        "root", "add_lambda_guard", "get_verbose_code_parts", "user_stack",
    }
)
_CODE_PREFIX = "torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids == "


def _mismatch(upstream, aot_utils, originals) -> str | None:
    """Why ``upstream`` (the builder method) or the helpers are not what the C
    guard mirrors, or None."""
    code = getattr(upstream, "__code__", None)
    if code is None or set(code.co_names) != _UPSTREAM_NAMES or _CODE_PREFIX not in code.co_consts:
        return "GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS is not the verified one"
    if (aot_utils.top_saved_tensors_hooks, aot_utils.saved_tensors_hooks_are_inlineable) != originals:
        return "AOTAutograd's saved-tensors-hooks helpers were replaced"
    return None


def install():
    """Put our builder in place of upstream's; returns the ``_state.Replaced``
    record, or None where this torch has no such guard."""
    import torch._dynamo.guards as guards
    import torch._functorch._aot_autograd.utils as aot_utils

    from . import _C
    from ._state import closed, count_built, count_fallback, is_enabled, replace

    builder = guards.GuardBuilder
    upstream = builder.__dict__.get("AUTOGRAD_SAVED_TENSORS_HOOKS")
    if upstream is None:
        return None
    originals = (aot_utils.top_saved_tensors_hooks, aot_utils.saved_tensors_hooks_are_inlineable)

    @functools.wraps(upstream)  # __name__, __qualname__ and guard_check_spec
    def AUTOGRAD_SAVED_TENSORS_HOOKS(self, guard):
        if not is_enabled():
            return upstream(self, guard)
        reason = closed() or _mismatch(upstream, aot_utils, originals)
        if reason is not None:
            count_fallback(f"saved-tensors-hooks guard: {reason}")
            return upstream(self, guard)
        # guard_hooks_ids = hooks_ids_fn(get_hooks()), with upstream's helpers
        hooks = aot_utils.top_saved_tensors_hooks()
        expected = (
            tuple(map(id, hooks)) if aot_utils.saved_tensors_hooks_are_inlineable(hooks) else None
        )
        code = [f"{_CODE_PREFIX}{expected}"]
        self._set_guard_export_info(guard, code)
        self.guard_manager.root.add_lambda_guard(
            _C.SavedHooksGuard(expected), guards.get_verbose_code_parts(code, guard),
            guard.user_stack,
        )
        count_built("guards")

    return replace(builder, "AUTOGRAD_SAVED_TENSORS_HOOKS", AUTOGRAD_SAVED_TENSORS_HOOKS)
