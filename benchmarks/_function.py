"""AOTAutograd's ``CompiledFunction`` alone: upstream's against torch_aot_rt's C one.

Each :class:`FunctionCase` is one training configuration (the ``training*``
functions of ``_cases.CONFIGS``) and one mode, and gives three callables on the
same inputs:

``direct``
    the compiled forward (mode ``fw``), or the compiled forward then the
    compiled backward (mode ``fw+bw``), called directly on fresh lists;
``upstream``
    ``make_boxed_func(CompiledFunction.apply)`` of an upstream-built class
    (what upstream's runtime wrapper calls), then, in ``fw+bw``,
    ``torch.autograd.backward(output, grad)``: the autograd engine runs
    upstream's ``CompiledFunction.backward``;
``c``
    the same with the class compiled with torch_aot_rt on: ``_C.FunctionApply``
    (the boxed apply the C runtime wrapper calls), ``_C.CompiledForward`` and
    ``_C.CompiledBackward`` (``None`` when the extension is not built or the
    compile fell back to upstream's class: see ``FunctionCase.c_note``).

How a case is made: the function is compiled twice with ``aot_function`` and
*recording* compilers (``boxed_nop`` underneath), once with torch_aot_rt off and
once on (the choice is made at the first call). The compiled forward and
backward run the real graph until armed; armed, the next call runs the real
graph and records its outputs (and the backward its arguments), and every later
call clears its argument list and returns a fresh list of the recorded outputs.
So after one recording call of ``apply`` + backward on the benchmark inputs
(apply called directly: no runtime wrapper, so no input mutation and no alias
replay happen), the variants differ only by ``CompiledFunction``: its
``apply``, ``forward`` (saving tensors, marking outputs, wrapping aliases),
``backward`` (prologue, tangent checks, epilogue) and the autograd machinery
around them (the graph node, ``torch.autograd.backward``, the engine, grad
accumulation into ``x.grad``), which any ``autograd.Function`` pays. The
forward returns the same tensor objects every call; autograd re-attaches their
history each time.

The runtime wrapper is not in these rows (``_cases.py`` measures it alone);
end to end, ``_e2e.py`` has both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks import _cases  # sets TORCH_AOT_RT=0 by default, loads torch_aot_rt

import torch  # noqa: E402  (after _cases: it sets the environment first)
import torch._functorch._aot_autograd.runtime_wrappers as rw  # noqa: E402
from functorch.compile import aot_function, make_boxed_func  # noqa: E402
from torch._dynamo.backends.debugging import boxed_nop  # noqa: E402

VARIANTS = ("direct", "upstream", "c")
MODES = ("fw", "fw+bw")
CONFIG_NAMES = ("training", "training_mutation", "training_alias")


def row_name(config: str, mode: str) -> str:
    return f"{config} {mode}"


ROWS = {row_name(c, m): (c, m) for c in CONFIG_NAMES for m in MODES}


class Recorder:
    """A boxed compiler (``boxed_nop`` underneath) whose compiled function runs
    the real graph until :meth:`arm`; then records one call and is trivial."""

    def __init__(self):
        self.armed = False
        self.args: tuple | None = None
        self.outs: tuple | None = None

    def arm(self):
        self.armed = True

    def compiler(self, gm, example_inputs):
        real = boxed_nop(gm, example_inputs)

        def compiled(args: list) -> list:
            outs = self.outs
            if outs is not None:
                args.clear()
                return list(outs)
            if not self.armed:
                return real(args)
            self.args = tuple(args)
            result = real(args)
            self.outs = tuple(result)
            return list(result)

        compiled._boxed_call = True  # type: ignore[attr-defined]
        return compiled


def _differentiable(outs) -> list[int]:
    return [
        i
        for i, o in enumerate(outs)
        if isinstance(o, torch.Tensor) and o.requires_grad
    ]


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _backward_all(outs) -> None:
    outs = _as_tuple(outs)
    diff = [outs[i] for i in _differentiable(outs)]
    torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])


def _compiled_class(outs):
    for o in _as_tuple(outs):
        fwd_cls = getattr(getattr(o, "grad_fn", None), "_forward_cls", None)
        if fwd_cls is not None:
            return fwd_cls
    raise RuntimeError("no output with a CompiledFunction grad_fn")


def _capture_apply(fn, flag: bool | None, inputs: tuple, fw_compiler, bw_compiler):
    """aot_function(fn) with these compilers, first call (and one backward, to
    compile it) on copies of ``inputs`` with torch_aot_rt on/off (``flag``;
    None: as installed). Returns (the apply the runtime wrapper calls: the
    compiled_fn it is given, or on 2.11 the C apply adopt_inline_class
    returned for it; CompiledFunction class)."""
    import contextlib
    import importlib

    recorded: list = []
    adopted: list = []
    installed = rw._create_runtime_wrapper

    def spy(compiled_fn, **kw):
        recorded.append(compiled_fn)
        return installed(compiled_fn, **kw)

    rt = _cases.torch_aot_rt
    switch = contextlib.nullcontext() if flag is None or rt is None else rt.enabled(flag)
    # 2.11 (compiled_function_factory=False): the runtime wrapper is handed
    # upstream's CompiledFunction.apply, and ours passes on the C apply that
    # adopt_inline_class returns for it: that one is what the C path calls
    plan = importlib.import_module("torch_aot_rt._autograd_plan") if rt is not None else None
    adopt = getattr(plan, "adopt_inline_class", None)

    def adopt_spy(compiled_fn):
        result = adopt(compiled_fn)
        adopted.append(result)
        return result

    rw._create_runtime_wrapper = spy
    if adopt is not None:
        plan.adopt_inline_class = adopt_spy
    try:
        compiled = aot_function(fn, fw_compiler=fw_compiler, bw_compiler=bw_compiler)
        with switch:
            out = compiled(*_cases._clone_inputs(inputs))
    finally:
        rw._create_runtime_wrapper = installed
        if adopt is not None:
            plan.adopt_inline_class = adopt
    if len(recorded) != 1 or len(adopted) > 1:
        raise RuntimeError(f"expected one runtime wrapper built, got {len(recorded)} "
                           f"(and {len(adopted)} inline classes adopted)")
    _backward_all(out)
    return (adopted or recorded)[0], _compiled_class(out)


def is_c_function(cls) -> bool:
    return _cases._C is not None and isinstance(
        cls.__dict__.get("forward").__func__, _cases._C.CompiledForward
    )


@dataclass
class Built:
    """One compile: the boxed apply, the class, its recorders."""

    apply: Callable
    cls: type
    fw: Recorder
    bw: Recorder


def _build(fn, flag: bool | None, inputs: tuple) -> Built:
    fw, bw = Recorder(), Recorder()
    compiled_fn, cls = _capture_apply(fn, flag, inputs, fw.compiler, bw.compiler)
    apply = compiled_fn if getattr(compiled_fn, "_boxed_call", False) else make_boxed_func(
        compiled_fn
    )
    return Built(apply, cls, fw, bw)


def _record(built: Built, inputs: tuple) -> tuple[list[int], tuple]:
    """The recording call: apply + backward on the benchmark inputs themselves.
    Returns (indices of the differentiable outputs, their grads)."""
    built.fw.arm()
    built.bw.arm()
    outs = built.apply(list(inputs))
    idx = _differentiable(outs)
    grads = tuple(torch.ones_like(outs[i]) for i in idx)
    torch.autograd.backward([outs[i] for i in idx], grads)
    if built.fw.outs is None or built.bw.outs is None:
        raise RuntimeError("the recording call did not reach the compiled forward/backward")
    return idx, grads


@dataclass
class FunctionCase:
    name: str
    config: str
    mode: str
    description: str
    inputs: tuple
    runs: dict[str, Callable[[], Any]] = field(default_factory=dict)
    builds: dict[str, Built] = field(default_factory=dict)
    c_note: str | None = None
    c_stats: dict | None = None  # torch_aot_rt.stats() delta of the C compile

    def call(self, variant: str) -> Callable[[], Any] | None:
        return self.runs.get(variant)

    def available(self) -> tuple[str, ...]:
        return tuple(v for v in VARIANTS if v in self.runs)


def _apply_run(apply, inputs, mode, idx, grads):
    if mode == "fw":
        def run():
            return apply(list(inputs))

        return run
    backward = torch.autograd.backward
    if len(idx) == 1:
        (k,), (g,) = idx, grads

        def run():
            backward(apply(list(inputs))[k], g)

        return run

    def run():
        outs = apply(list(inputs))
        backward([outs[i] for i in idx], grads)

    return run


def _direct_run(built: Built, inputs, mode):
    fw = built.cls.compiled_fw
    if mode == "fw":
        def run():
            return fw(list(inputs))

        return run
    bw = built.cls.compiled_bw
    bw_args = built.bw.args

    def run():
        fw(list(inputs))
        return bw(list(bw_args))

    return run


@functools.lru_cache(maxsize=None)
def _built_config(config: str):
    """Both compiles of one configuration, shared by its fw and fw+bw rows."""
    fn, make_inputs, _joint, description = _cases.CONFIGS[config]
    torch.manual_seed(0)
    inputs = make_inputs()
    rt, have_c = _cases.torch_aot_rt, _cases._C is not None
    builds: dict[str, Built] = {}
    builds["upstream"] = _build(fn, False if have_c else None, inputs)
    c_note = c_stats = None
    if not have_c:
        c_note = _cases.C_UNAVAILABLE
    else:
        before = rt.stats()
        built = _build(fn, True, inputs)
        after = rt.stats()
        c_stats = {
            k: after[k] - before[k]
            for k in ("runtime_wrappers", "autograd_functions", "fallbacks")
        }
        if is_c_function(built.cls):
            builds["c"] = built
        else:
            c_note = f"C CompiledFunction not used: stats delta {c_stats}, " \
                     f"reasons {after['fallback_reasons']}"
    if is_c_function(builds["upstream"].cls):
        raise RuntimeError(f"{config}: the upstream compile got the C CompiledFunction")
    recorded = {v: _record(b, inputs) for v, b in builds.items()}
    return description, inputs, builds, recorded, c_note, c_stats


def build_function_case(name: str, *, warmup: int = 3) -> FunctionCase:
    config, mode = ROWS[name]
    description, inputs, builds, recorded, c_note, c_stats = _built_config(config)
    what = "apply" if mode == "fw" else "apply + torch.autograd.backward"
    case = FunctionCase(
        name, config, mode, f"CompiledFunction {what}: {description}", inputs,
        builds=builds, c_note=c_note, c_stats=c_stats,
    )
    case.runs["direct"] = _direct_run(builds["upstream"], inputs, mode)
    for variant, built in builds.items():
        idx, grads = recorded[variant]
        case.runs[variant] = _apply_run(built.apply, inputs, mode, idx, grads)
    for variant in case.available():
        run = case.call(variant)
        for _ in range(warmup):
            run()
    return case


def build_function_cases(names=None) -> dict[str, FunctionCase]:
    return {n: build_function_case(n) for n in (names or ROWS)}


# ---------------------------------------------------------------------------
# checking that C and upstream give the same outputs and grads


def _grads_state(inputs: tuple) -> list:
    return [
        _cases.describe(t.grad, inputs) if isinstance(t, torch.Tensor) and t.grad is not None
        else None
        for t in inputs
    ]


@functools.lru_cache(maxsize=None)
def check_config(config: str) -> tuple[bool | None, str]:
    """Compile ``config`` for real (boxed_nop, no recording) with torch_aot_rt
    off and on, call each through its runtime wrapper on fresh copies of the
    inputs, backward from every differentiable output with ones, and compare
    the outputs, the inputs (values, versions) and their grads."""
    if _cases._C is None:
        return None, "no C CompiledFunction"
    fn, make_inputs, _joint, _desc = _cases.CONFIGS[config]
    torch.manual_seed(0)
    base = make_inputs()
    seen = {}
    for flag in (False, True):
        inputs = _cases._clone_inputs(base)
        compiled = aot_function(fn, fw_compiler=boxed_nop, bw_compiler=boxed_nop)
        try:
            with _cases.torch_aot_rt.enabled(flag):
                out = compiled(*inputs)
            kind = is_c_function(_compiled_class(out))
            result = _cases.describe(out, inputs)
            _backward_all(out)
            grads = _grads_state(inputs)
        except Exception as e:  # compare exceptions as results
            kind, result, grads = None, ("raised", type(e).__name__, str(e)), None
        if kind is not flag:
            return False, f"{'C' if flag else 'upstream'} compile got the wrong class"
        seen[flag] = (result, grads, _cases._state(inputs))
    if seen[False] == seen[True]:
        return True, "c == upstream"
    return False, f"MISMATCH\n  upstream: {seen[False]}\n  c:        {seen[True]}"


def _measured_outputs(case: FunctionCase, variant: str):
    """What the measured C/upstream apply returns (trivial graphs), described."""
    out = case.builds[variant].apply(list(case.inputs))
    return _cases.describe(out, case.inputs)


def check_c_matches_upstream(case: FunctionCase) -> tuple[bool | None, str]:
    """The real-compile check of the row's configuration, plus the outputs of
    the measured (trivial-graph) ``apply`` of C and upstream compared."""
    if "c" not in case.runs:
        return None, "no C variant"
    ok, msg = check_config(case.config)
    if ok is not True:
        return ok, msg
    up, c = _measured_outputs(case, "upstream"), _measured_outputs(case, "c")
    if up != c:
        return False, f"MISMATCH (measured apply)\n  upstream: {up}\n  c:        {c}"
    return True, "c == upstream"
