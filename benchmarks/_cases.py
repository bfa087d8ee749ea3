"""Configurations of the AOTAutograd runtime wrapper, for measuring its overhead.

Each :class:`Case` gives three callables on the same inputs:

``direct``
    the trivial compiled function, called directly;
``upstream``
    upstream's runtime wrapper (``_create_runtime_wrapper``) around it;
``c``
    torch_aot_rt's C runtime wrapper around it (``None`` when the extension is
    not built, or when the plan fell back to upstream: see ``Case.c_note``).

How a case is made: a small function is compiled with ``aot_function`` and no-op
compilers while ``runtime_wrappers._create_runtime_wrapper`` is wrapped to record
the keyword arguments AOTAutograd builds the runtime wrapper with. The real
``compiled_fn`` is called once to record its outputs, then replaced by a trivial
boxed function that clears its argument list (upstream hands over ownership:
``steal_args``) and returns a fresh list of the recorded outputs. So the three
variants differ only by the runtime wrapper: no kernels, no autograd graph built
per call.

Every call takes a fresh ``list(inputs)``, the same in all three variants
(``Case.call(variant)`` returns a zero-argument callable doing exactly that).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

# The import of torch_aot_rt must never fail here (the C extension may not be
# built yet): keep it from enabling itself, and install its hook explicitly.
os.environ.setdefault("TORCH_AOT_RT", "0")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  (before runtime_wrappers: circular import)
import torch._functorch._aot_autograd.runtime_wrappers as rw  # noqa: E402
from functorch.compile import aot_function  # noqa: E402
from torch._dynamo.backends.debugging import boxed_nop  # noqa: E402

VARIANTS = ("direct", "upstream", "c")

_UPSTREAM_AT_IMPORT = rw._create_runtime_wrapper


def _load_torch_aot_rt():
    """(torch_aot_rt module or None, _C module or None, reason if unavailable)."""
    try:
        import torch_aot_rt
        from torch_aot_rt import _install, _state
    except Exception as e:  # pragma: no cover - depends on the build state
        return None, None, f"import torch_aot_rt failed: {type(e).__name__}: {e}"
    try:
        _install.install()
        from torch_aot_rt import _C
    except Exception as e:
        return torch_aot_rt, None, f"C extension unavailable: {type(e).__name__}: {e}"
    inactive = _state.closed()
    if inactive:
        return torch_aot_rt, None, f"C path inactive: {inactive}"
    return torch_aot_rt, _C, None


torch_aot_rt, _C, C_UNAVAILABLE = _load_torch_aot_rt()


def upstream_builder():
    """Upstream's own ``_create_runtime_wrapper``, whatever is installed now."""
    if torch_aot_rt is not None:
        from torch_aot_rt import _state

        if "upstream" in _state.installed:
            return _state.installed["upstream"]
    return _UPSTREAM_AT_IMPORT


def c_builder():
    """``build_runtime_wrapper``-shaped callable for the C wrapper, or None."""
    if _C is None:
        return None
    from torch_aot_rt import _plan

    upstream = upstream_builder()

    def build(compiled_fn, **kw):
        return _plan.build_runtime_wrapper(upstream, compiled_fn, **kw)

    return build


def is_c_wrapper(fn) -> bool:
    return _C is not None and isinstance(fn, _C.RuntimeWrapper)


# ---------------------------------------------------------------------------
# the functions compiled


def _inference_plain(x, y):
    return x * y


def _inference_mutation(x, y):
    x.add_(1)
    return x * y


def _inference_alias(x):
    return x.view(-1)


def _training_plain(x, y):
    return x * y


def _training_mutation(x, buf):
    # a buffer that does not require grad, updated in place (BatchNorm's
    # running stats): the epilogue copy_()s into it.
    buf.add_(1)
    return x * buf


def _training_alias(x):
    # one plain output and one output aliasing the input: trace_joint=True and
    # the compiled function returns a TensorAlias for the second.
    return x * 2, x.view(-1)


def _small(*shape, requires_grad=False):
    return torch.randn(*shape).requires_grad_(requires_grad)


# name -> (function, input factory, expected trace_joint, description)
CONFIGS: dict[str, tuple[Callable, Callable[[], tuple], bool, str]] = {
    "inference": (
        _inference_plain,
        lambda: (_small(4), _small(4)),
        False,
        "inference, x * y, no mutation, no alias",
    ),
    "inference_mutation": (
        _inference_mutation,
        lambda: (_small(4), _small(4)),
        False,
        "inference, x.add_(1) (epilogue copy_ of 4 floats)",
    ),
    "inference_alias": (
        _inference_alias,
        lambda: (_small(2, 2),),
        False,
        "inference, return x.view(-1) (alias replay)",
    ),
    "training": (
        _training_plain,
        lambda: (_small(4, requires_grad=True), _small(4, requires_grad=True)),
        True,
        "training (trace_joint), x * y",
    ),
    "training_mutation": (
        _training_mutation,
        lambda: (_small(4, requires_grad=True), torch.zeros(4)),
        True,
        "training, buf.add_(1) on a non-grad input (epilogue copy_)",
    ),
    "training_alias": (
        _training_alias,
        lambda: (_small(2, 2, requires_grad=True),),
        True,
        "training, return x * 2, x.view(-1) (TensorAlias + alias replay)",
    ),
}


# ---------------------------------------------------------------------------
# building a case


def make_trivial(outputs) -> Callable[[list], list]:
    """A boxed compiled function returning a fresh list of ``outputs``."""
    outs = tuple(outputs)

    def trivial(args: list) -> list:
        args.clear()
        return list(outs)

    trivial._boxed_call = True  # type: ignore[attr-defined]
    return trivial


def capture_wrapper_kwargs(fn: Callable, inputs: tuple) -> tuple[Callable, dict]:
    """Compile ``fn`` with ``aot_function`` + no-op compilers; return the
    ``compiled_fn`` and keyword arguments ``_create_runtime_wrapper`` got."""
    recorded: list = []
    installed = rw._create_runtime_wrapper

    def spy(compiled_fn, **kw):
        recorded.append((compiled_fn, kw))
        return installed(compiled_fn, **kw)

    rw._create_runtime_wrapper = spy
    try:
        compiled = aot_function(fn, fw_compiler=boxed_nop, bw_compiler=boxed_nop)
        compiled(*_clone_inputs(inputs))
    finally:
        rw._create_runtime_wrapper = installed
    if len(recorded) != 1:
        raise RuntimeError(f"expected one runtime wrapper built, got {len(recorded)}")
    return recorded[0]


def _clone_inputs(inputs: tuple) -> tuple:
    return tuple(
        t.detach().clone().requires_grad_(t.requires_grad)
        if isinstance(t, torch.Tensor)
        else t
        for t in inputs
    )


def _record_outputs(compiled_fn, inputs: tuple) -> list:
    args = list(_clone_inputs(inputs))
    if getattr(compiled_fn, "_boxed_call", False):
        outs = compiled_fn(args)
    else:  # training: CompiledFunction.apply, called unboxed
        outs = compiled_fn(*args)
    if isinstance(outs, tuple):
        outs = list(outs)
    elif not isinstance(outs, list):
        outs = [outs]
    return outs


@dataclass
class Case:
    name: str
    description: str
    inputs: tuple
    kwargs: dict
    trivial: Callable
    wrappers: dict[str, Callable | None] = field(default_factory=dict)
    c_note: str | None = None

    def fn(self, variant: str) -> Callable | None:
        if variant == "direct":
            return self.trivial
        return self.wrappers.get(variant)

    def call(self, variant: str) -> Callable[[], Any] | None:
        """A zero-argument callable: one call of ``variant`` on a fresh list."""
        fn = self.fn(variant)
        if fn is None:
            return None
        inputs = self.inputs

        def run():
            return fn(list(inputs))

        return run

    def available(self) -> tuple[str, ...]:
        return tuple(v for v in VARIANTS if self.fn(v) is not None)


def build_case(name: str, *, warmup: int = 3) -> Case:
    fn, make_inputs, expect_joint, description = CONFIGS[name]
    torch.manual_seed(0)
    inputs = make_inputs()
    compiled_fn, kw = capture_wrapper_kwargs(fn, inputs)
    if bool(kw["trace_joint"]) != expect_joint:
        raise RuntimeError(
            f"{name}: expected trace_joint={expect_joint}, got {kw['trace_joint']}"
        )
    trivial = make_trivial(_record_outputs(compiled_fn, inputs))
    case = Case(name, description, inputs, dict(kw), trivial)
    case.wrappers["upstream"] = upstream_builder()(trivial, **kw)
    build_c = c_builder()
    if build_c is None:
        case.c_note = C_UNAVAILABLE
    else:
        before = torch_aot_rt.stats()["fallbacks"]
        wrapper = build_c(trivial, **kw)
        if is_c_wrapper(wrapper):
            case.wrappers["c"] = wrapper
        else:
            reasons = torch_aot_rt.stats()["fallback_reasons"]
            case.c_note = (
                f"C path fell back to upstream (fallbacks {before} -> "
                f"{torch_aot_rt.stats()['fallbacks']}; reasons {reasons})"
            )
    # The first call may run under the custom-op aliasing check mode; keep it
    # and any other first-call work out of the measurements.
    for variant in case.available():
        run = case.call(variant)
        for _ in range(warmup):
            run()
    return case


def build_cases(names=None) -> dict[str, Case]:
    return {n: build_case(n) for n in (names or CONFIGS)}


# ---------------------------------------------------------------------------
# checking that the C wrapper returns what upstream returns


def describe(obj: Any, inputs: tuple) -> Any:
    """A comparable description of a wrapper result, observable properties only."""
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [describe(o, inputs) for o in obj])
    if isinstance(obj, torch.Tensor):
        def input_index(t):
            for i, inp in enumerate(inputs):
                if t is inp:
                    return i
            return None if t is None else "other"

        storage = obj.untyped_storage().data_ptr()
        shares = [
            i
            for i, inp in enumerate(inputs)
            if isinstance(inp, torch.Tensor)
            and inp.untyped_storage().data_ptr() == storage
        ]
        return {
            "type": type(obj).__name__,
            "dtype": str(obj.dtype),
            "size": tuple(obj.size()),
            "stride": tuple(obj.stride()),
            "storage_offset": obj.storage_offset(),
            "requires_grad": obj.requires_grad,
            "is_leaf": obj.is_leaf,
            "grad_fn": type(obj.grad_fn).__name__ if obj.grad_fn is not None else None,
            "is_view": obj._is_view(),
            "_base": input_index(obj._base),
            "is_input": input_index(obj),
            "shares_storage_with_inputs": shares,
            "values": obj.detach().tolist(),
        }
    return (type(obj).__name__, repr(obj))


def _state(inputs: tuple) -> Any:
    return {
        "grad_enabled": torch.is_grad_enabled(),
        "view_replay": torch._C._is_view_replay_enabled(),
        "inputs": [
            (inp.detach().tolist(), inp._version, inp.requires_grad)
            if isinstance(inp, torch.Tensor)
            else repr(inp)
            for inp in inputs
        ],
    }


def check_c_matches_upstream(case: Case) -> tuple[bool | None, str]:
    """Call upstream and C once each on fresh copies of the inputs (the same
    trivial compiled function) and compare results and input state.

    Returns (ok, message); ok is None when there is no C wrapper to compare.
    """
    if case.fn("c") is None:
        return None, "no C wrapper"
    seen = {}
    for variant in ("upstream", "c"):
        inputs = _clone_inputs(case.inputs)
        versions_before = [
            t._version if isinstance(t, torch.Tensor) else None for t in inputs
        ]
        try:
            out = case.fn(variant)(list(inputs))
            result = describe(out, inputs)
        except Exception as e:  # compare exceptions as results
            result = ("raised", type(e).__name__, str(e))
        state = _state(inputs)
        state["version_bumps"] = [
            (t._version - v) if isinstance(t, torch.Tensor) else None
            for t, v in zip(inputs, versions_before)
        ]
        seen[variant] = (result, state)
    if seen["upstream"] == seen["c"]:
        return True, "c == upstream"
    return False, f"MISMATCH\n  upstream: {seen['upstream']}\n  c:        {seen['c']}"
