"""torch_aot_rt: AOTAutograd's per-call runtime in C.

``import torch_aot_rt`` makes every AOTAutograd compile that happens afterwards
(``torch.compile``, ``aot_function``/``aot_module``, AOTAutogradCache hits) use the
C runtime wrapper. ``TORCH_AOT_RT=0`` in the environment makes the import change
nothing. What the C path does not support runs upstream's own code, counted in
:func:`stats` with a reason.

The C path runs only on the torch releases it was verified against
(``_versions.VERIFIED``, each with the fingerprints of the upstream code it
mirrors, ``_fingerprints``); on any other torch the import replaces nothing of
torch's and says so once with an :class:`InactiveWarning`, unless
``TORCH_AOT_RT_UNVERIFIED=1`` opts in at the user's own risk.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from . import _install, _state
from ._install import InactiveWarning
from ._state import is_enabled
from ._version import __version__

__all__ = ["enable", "disable", "enabled", "is_enabled", "stats", "reset_stats",
           "InactiveWarning", "__version__"]


def enable() -> None:
    """Use the C runtime for everything AOTAutograd compiles from now on
    (where the gate is open: on any other torch this changes nothing)."""
    _install.install()
    _state.set_enabled(True)


def disable() -> None:
    """Use upstream's runtime for everything compiled from now on.

    Functions already compiled keep the runtime they were built with.
    """
    _state.set_enabled(False)


@contextlib.contextmanager
def enabled(flag: bool = True) -> Iterator[None]:
    """Context manager: switch the C runtime on or off for compiles inside it."""
    previous = _state.is_enabled()
    if flag:
        enable()
    else:
        disable()
    try:
        yield
    finally:
        _state.set_enabled(previous)


def stats() -> dict:
    """Counters since import (or :func:`reset_stats`): a snapshot copy.

    ``runtime_wrappers``: C runtime wrappers built; ``autograd_functions``: C
    CompiledFunction classes built; ``guards``: Dynamo saved-tensor-hooks
    guards built with the C check; ``serializable_functions``:
    SerializableCompiledFunctions given the C ``__call__``; ``params_prepends``:
    ``aot_module_simplified`` forwards made C ``ParamsPrepend``s; ``wrappers``: the
    other compiler wrappers' generated functions (dedupe, synthetic base, effect
    tokens, functionalized RNG, fakified outputs, debug asserts) made C objects;
    ``subclass_wrappers``: AOTDispatchSubclassWrapper's generated wrappers
    made C ``SubclassWrapper``s; ``fallbacks``: builds that went to upstream,
    with ``fallback_reasons`` mapping each reason to its count. ``torch``: the
    installed version, the verified release whose semantics the C path uses
    (None when it is inactive), whether that is by the
    ``TORCH_AOT_RT_UNVERIFIED=1`` opt-in, and ``inactive``: why nothing of
    torch's was replaced (an unverified release, mirrored code that differs
    from the verified source, internals that do not bind), or None (all None
    before the C path is first enabled).
    ``python``: the interpreter's version and build kind (``default``,
    ``free-threaded``, ...). The C core's counters below are empty where
    the gate closed before loading it (an interpreter it does not verify).
    ``cpp``: the C++ part's module when the C core uses it, else None and the
    reason (not built for this torch, built against another, or
    ``TORCH_AOT_RT_CPP=0``). ``cpp_node``: calls of C CompiledFunctions by
    the C++ autograd node's decision: ``taken``, or the reason upstream's
    ``Function.apply`` ran instead (all zero without the C++ part).
    ``cpp_epilogue``: the runtime wrapper epilogue's tensor operations
    (mutation ``copy_``/``as_strided_``/``set_``, alias view replay) by
    route while the C++ part is in use: ``taken`` by it, or why the Python
    method ran (all zero without the C++ part).
    ``dynamo_disable``: compiled backwards whose ``torch._dynamo.disable``
    wrapper runs in C (``built``) or why not, the calls of those by path
    (``calls in C`` or why upstream's wrapper ran), and ``unavailable``: why
    no compiled backward gets it on this torch, or None.
    ``dynamo_bytecode_helpers``: calls of the functions Dynamo's bytecode calls
    around a graph's argument preparation
    (``torch._dynamo.utils.record_pregraph_bytecode_enter``/``_exit``) by
    path: ``calls in C``, or why upstream's ran. ``inductor_graph_call``:
    calls of inductor's compiled graphs (``CompiledFxGraph.__call__``) by
    path, the same way. ``dynamo_compile_wrapper``: compiled functions whose
    ``compile_wrapper`` (what ``torch.compile`` returns) runs in C
    (``built``), and their calls by path. ``config_reads``: the torch config
    settings our layers read per call, read ``in C`` (as
    ``ConfigModule.__getattr__`` returns them) or by ``upstream's`` attribute
    read (a deprecated, aliased or hidden setting, a mutable default; every
    read on torch 2.11).
    """
    gate = _state.gate()
    inactive = _state.installed.get("closed") if gate else None
    out = _state.counters()
    out["torch"] = {
        "version": gate.torch_version if gate else None,
        "release": gate.release.name if gate and gate.release and not inactive else None,
        "unverified_opt_in": gate.unverified_opt_in if gate else None,
        "inactive": inactive,
    }
    out["python"] = {
        "version": "%d.%d.%d" % sys.version_info[:3],
        "build": gate.kind if gate else None,
    }
    cpp_module, cpp_reason = _state.cpp()
    out["cpp"] = {"module": cpp_module, "reason": cpp_reason}
    for key, name in _C_COUNTERS:
        out[key] = _c_stats(name)
    out["dynamo_disable"]["unavailable"] = _state.disable_unavailable()
    return out


# stats()'s keys that the C core counts, and its function that answers each
_C_COUNTERS = (
    ("cpp_node", "_node_stats"),
    ("cpp_epilogue", "_epilogue_stats"),
    ("dynamo_disable", "_disable_stats"),
    ("dynamo_bytecode_helpers", "_helper_stats"),
    ("inductor_graph_call", "_graph_call_stats"),
    ("dynamo_compile_wrapper", "_compile_wrapper_stats"),
    ("config_reads", "_config_read_stats"),
)


def _c_stats(name: str, reset: bool = False) -> dict:
    """One of the C core's counters, or {} where the extension is not loaded
    (the gate closed before loading it: nothing of ours ran)."""
    c = sys.modules.get(__name__ + "._C")
    return {} if c is None else getattr(c, name)(reset)


def reset_stats() -> None:
    _state.reset_counters()
    for _, name in _C_COUNTERS:
        _c_stats(name, reset=True)


if os.environ.get("TORCH_AOT_RT", "1").strip().lower() not in ("0", "false", "off", "no"):
    enable()
