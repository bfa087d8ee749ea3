"""torch_aot_rt: AOTAutograd's per-call runtime in C.

``import torch_aot_rt`` makes every AOTAutograd compile that happens afterwards
(``torch.compile``, ``aot_function``/``aot_module``, AOTAutogradCache hits) use the
C runtime wrapper. ``TORCH_AOT_RT=0`` in the environment makes the import change
nothing. What the C path does not support runs upstream's own code, counted in
:func:`stats` with a reason.

The C path runs only on the torch releases it was verified against
(``_versions.VERIFIED``); on any other, every compile falls back, unless
``TORCH_AOT_RT_UNVERIFIED=1`` opts in at the user's own risk.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["enable", "disable", "enabled", "is_enabled", "stats", "reset_stats"]
__version__ = "0.1.0"

_lock = threading.Lock()
_state = {"enabled": False}
_counters: dict = {
    "runtime_wrappers": 0,
    "autograd_functions": 0,
    "guards": 0,
    "serializable_functions": 0,
    "params_prepends": 0,
    "fallbacks": 0,
    "fallback_reasons": {},
}


def _count_built(kind: str) -> None:
    with _lock:
        _counters[kind] += 1


def _count_fallback(reason: str) -> None:
    with _lock:
        _counters["fallbacks"] += 1
        reasons = _counters["fallback_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1


def is_enabled() -> bool:
    """Whether functions compiled from now on get the C runtime."""
    return _state["enabled"]


def enable() -> None:
    """Use the C runtime for everything AOTAutograd compiles from now on."""
    from . import _patch

    _patch.install()
    _state["enabled"] = True


def disable() -> None:
    """Use upstream's runtime for everything compiled from now on.

    Functions already compiled keep the runtime they were built with.
    """
    _state["enabled"] = False


@contextlib.contextmanager
def enabled(flag: bool = True) -> Iterator[None]:
    """Context manager: switch the C runtime on or off for compiles inside it."""
    previous = _state["enabled"]
    if flag:
        enable()
    else:
        disable()
    try:
        yield
    finally:
        _state["enabled"] = previous


def stats() -> dict:
    """Counters since import (or :func:`reset_stats`): a snapshot copy.

    ``runtime_wrappers``: C runtime wrappers built; ``autograd_functions``: C
    CompiledFunction classes built; ``guards``: Dynamo saved-tensor-hooks
    guards built with the C check; ``serializable_functions``:
    SerializableCompiledFunctions given the C ``__call__``; ``params_prepends``:
    ``aot_module_simplified`` forwards made C ``ParamsPrepend``s; ``fallbacks``: builds that went to upstream,
    with ``fallback_reasons`` mapping each reason to its count. ``torch``: the
    installed version, the verified release whose semantics the C path uses
    (None: every compile falls back), and whether that is by the
    ``TORCH_AOT_RT_UNVERIFIED=1`` opt-in (None before the C path is enabled).
    ``cpp``: the C++ part's module when the C core uses it, else None and the
    reason (not built for this torch, built against another, or
    ``TORCH_AOT_RT_CPP=0``). ``cpp_node``: calls of C CompiledFunctions by
    the C++ autograd node's decision: ``taken``, or the reason upstream's
    ``Function.apply`` ran instead (all zero without the C++ part).
    ``dynamo_disable``: compiled backwards whose ``torch._dynamo.disable``
    wrapper runs in C (``built``) or why not, the calls of those by path
    (``calls in C`` or why upstream's wrapper ran), and ``unavailable``: why
    no compiled backward gets it on this torch, or None.
    """
    from . import _patch

    gate = _patch.gate()
    with _lock:
        out = dict(_counters)
        out["fallback_reasons"] = dict(_counters["fallback_reasons"])
    out["torch"] = {
        "version": gate.torch_version if gate else None,
        "release": gate.release.name if gate and gate.release else None,
        "unverified_opt_in": gate.unverified_opt_in if gate else None,
    }
    cpp_module, cpp_reason = _patch.cpp()
    out["cpp"] = {"module": cpp_module, "reason": cpp_reason}
    out["cpp_node"] = _node_stats()
    out["dynamo_disable"] = _disable_stats()
    out["dynamo_disable"]["unavailable"] = _patch.disable_unavailable()
    return out


def _node_stats(reset: bool = False) -> dict:
    from . import _C

    return _C._node_stats(reset)


def _disable_stats(reset: bool = False) -> dict:
    from . import _C

    return _C._disable_stats(reset)


def reset_stats() -> None:
    with _lock:
        for key in ("runtime_wrappers", "autograd_functions", "guards", "serializable_functions",
                    "params_prepends", "fallbacks"):
            _counters[key] = 0
        _counters["fallback_reasons"] = {}
        _node_stats(reset=True)
        _disable_stats(reset=True)


if os.environ.get("TORCH_AOT_RT", "1").strip().lower() not in ("0", "false", "off", "no"):
    enable()
