"""What every part of the shim shares, below all of them.

The switch (:func:`is_enabled`), the counters behind ``stats()``, what the
installer decided for this torch (:data:`installed`: the gate, why the C path
is closed, the C++ part, ...) and the one way we put an attribute of torch's in
place (:func:`replace`). The builders (``_plan``, ``_autograd_plan``, ``_saved_hooks_guard``,
``_params_prepend``, ``_serializable_call``) read these; only ``_install`` writes
:data:`installed`, and nothing imports ``_install`` but the package itself.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

_lock = threading.Lock()
_enabled = [False]

COUNTERS = ("runtime_wrappers", "autograd_functions", "guards", "serializable_functions",
            "params_prepends", "wrappers", "subclass_wrappers", "fallbacks")
_counters: dict = dict.fromkeys(COUNTERS, 0)
_counters["fallback_reasons"] = {}

# Filled once by _install.install(): "gate" (_versions.Gate), "closed" (why the
# C path does not run on this torch, or absent), "cpp" ((module, reason)),
# "disable" (why the C disable wrapper is unavailable, or None),
# "capture_sink" (the release's source-capture sink), "replaced" (the
# Replaced records, in installation order), "upstream" (upstream's
# _create_runtime_wrapper), "upstream_post_compile".
installed: dict = {}


def is_enabled() -> bool:
    return _enabled[0]


def set_enabled(flag: bool) -> None:
    _enabled[0] = bool(flag)


def count_built(kind: str) -> None:
    with _lock:
        _counters[kind] += 1


def count_fallback(reason: str) -> None:
    with _lock:
        _counters["fallbacks"] += 1
        reasons = _counters["fallback_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1


def internal_error(e: BaseException) -> str:
    """The fallback reason for an exception raised while building our
    version of something: the torch's internals are not the ones we read."""
    return f"torch internals differ: {type(e).__name__}: {e}"


def counters() -> dict:
    """A snapshot copy of the counters."""
    with _lock:
        out = dict(_counters)
        out["fallback_reasons"] = dict(_counters["fallback_reasons"])
    return out


def reset_counters() -> None:
    with _lock:
        for key in COUNTERS:
            _counters[key] = 0
        _counters["fallback_reasons"] = {}


def gate():
    """The ``_versions.Gate`` decided at install, or None before it."""
    return installed.get("gate")


def closed() -> str | None:
    """Why the C path does not run on this torch (nothing of torch's is then
    replaced), or None; "not installed" before the install."""
    if not installed:
        return "not installed"
    return installed.get("closed")


def release():
    """The verified release (``_versions.Release``) whose semantics plans use."""
    return installed["gate"].release


def cpp():
    """``(module name, None)`` when the C++ part is in use, else ``(None, reason)``."""
    return installed.get("cpp", (None, closed() or "not installed"))


def disable_unavailable() -> str | None:
    """Why compiled backwards keep upstream's disable wrapper, or None."""
    return installed.get("disable", closed() or "not installed")


def source_capture_active() -> bool:
    """Whether upstream is capturing the generated runtime-wrapper source
    (``aot_autograd.compile_to_python``): the capture needs its wrappers."""
    sink = installed.get("capture_sink")
    return sink is not None and sink() is not None


class Replaced(NamedTuple):
    """A class or module attribute we put in place of upstream's (see :func:`replace`)."""

    owner: Any
    name: str
    upstream: Any
    ours: Any


def nested_code(code, name: str):
    """The one code object named ``name`` among ``code``'s constants (a
    function defined inside the one ``code`` runs), or None (none, or
    several)."""
    import types

    found = [c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == name]
    return found[0] if len(found) == 1 else None


def replace(owner: Any, name: str, ours) -> Replaced:
    """Set ``owner.name = ours``; the record :func:`restore` undoes."""
    replaced = Replaced(owner, name, owner.__dict__[name], ours)
    setattr(owner, name, ours)
    return replaced


def restore(replaced: Replaced) -> None:
    """Put upstream's attribute back, unless someone replaced ours since."""
    if replaced.owner.__dict__.get(replaced.name) is replaced.ours:
        setattr(replaced.owner, replaced.name, replaced.upstream)
