"""End to end: ``torch.compile(backend="aot_eager")`` of a one-op function, with
upstream's runtime (runtime wrapper, and ``CompiledFunction`` when the input
requires grad) and with the C one, against eager.

Each (row, variant) compiles its own copy of the function (a distinct code
object, so Dynamo keeps a separate cache entry with one guard set each).
torch_aot_rt's on/off choice is made when the function is first called, so the
first (warm-up) calls run inside ``torch_aot_rt.enabled(flag)``.

The ``requires_grad_backward`` row calls ``y = f(x); y.backward(g)`` (g a fixed
tensor of ones): the compiled forward and backward, both through
``CompiledFunction``, and the grad accumulated into ``x.grad``, as eager does.
The ``mlp_training_step`` row does the same for the loss of a small MLP
(Linear 16→32, ReLU, Linear 32→8, sum; parameters require grad, the input
does not): a training step's forward and backward, without the optimizer.
The ``inductor_*`` rows are the no-grad row and the two training rows
compiled by inductor. The ``rto_*`` rows are upstream's runtime-overhead
benchmark's cases (a compiled ``a + 1`` on ``torch.ones(2)``, by inductor and
by the eager backend) and a small MLP module, no grad and a training step.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch._dynamo

from benchmarks import _cases  # sets the TORCH_AOT_RT=0 default, loads torch_aot_rt

# "graph": a row's floor, the graph alone: the eager backend's captured
# GraphModule, inductor's generated code (forward and, for a training step,
# backward) called directly
E2E_VARIANTS = ("eager", "upstream", "c", "graph")


def one_op(x):
    return x.sin()


torch.manual_seed(0)
_MLP = torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
)


def mlp_loss(x):
    return _MLP(x).sum()


def affine(x):
    return x * 2 + 1


def add_one(a):
    return a + 1


def _two_tensor(shape):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(torch.randn(shape), torch.randn(shape))


# row -> (description, requires_grad, context manager factory, backward too);
# the function and input of each row: FUNCTIONS (default one_op on a 4-vector)
ROWS: dict[
    str, tuple[str, bool, Callable[[], contextlib.AbstractContextManager], bool]
] = {
    "no_grad_input": (
        "x.sin(), requires_grad=False", False, contextlib.nullcontext, False
    ),
    "inference_mode": (
        "x.sin(), under torch.inference_mode()",
        False,
        torch.inference_mode,
        False,
    ),
    "requires_grad": (
        "x.sin(), requires_grad=True (forward only)",
        True,
        contextlib.nullcontext,
        False,
    ),
    "requires_grad_backward": (
        "y = x.sin(), requires_grad=True; y.backward(g)",
        True,
        contextlib.nullcontext,
        True,
    ),
    "mlp_training_step": (
        "loss = mlp(x).sum(); loss.backward() (small MLP, parameters require grad)",
        False,
        contextlib.nullcontext,
        True,
    ),
}

# The inference row and the two training rows again, compiled by inductor (the
# backend users run): its kernels differ from eager's, so "overhead over eager"
# there includes what the fused kernels save, alike for upstream and C.
ROWS["twotensor_no_grad"] = (
    "x * 2 + 1 on a TwoTensor of 8 elements, requires_grad=False", False,
    contextlib.nullcontext, False,
)
ROWS["twotensor_backward"] = (
    "y = x * 2 + 1 on a TwoTensor of 8 elements, requires_grad=True; y.backward(g)", True,
    contextlib.nullcontext, True,
)
ROWS["inductor_no_grad_input"] = ROWS["no_grad_input"]
ROWS["inductor_requires_grad_backward"] = ROWS["requires_grad_backward"]
ROWS["inductor_mlp_training_step"] = ROWS["mlp_training_step"]

# Upstream's own runtime-overhead benchmark
# (benchmarks/dynamo/pr_time_benchmarks/benchmarks/runtime_overhead.py in
# PyTorch's repository): a compiled `a + 1` on torch.ones(2), no grad,
# inference mode, requires_grad (forward), backward and dynamic, by inductor
# and by the eager backend; and a small MLP module (3 Linear layers of 64,
# batch 8), no grad and a training step, by inductor. The whole compiled call
# is measured: Dynamo's, AOTAutograd's and inductor's layers.
for _backend in ("inductor", "eager"):
    ROWS[f"rto_{_backend}_no_grad"] = ("a + 1 on torch.ones(2), torch.no_grad()", False,
                                       torch.no_grad, False)
    ROWS[f"rto_{_backend}_inference_mode"] = ("a + 1, torch.inference_mode()", False,
                                              torch.inference_mode, False)
    ROWS[f"rto_{_backend}_requires_grad"] = ("a + 1, requires_grad=True (forward)", True,
                                             contextlib.nullcontext, False)
    ROWS[f"rto_{_backend}_backward"] = ("y = a + 1, requires_grad=True; y.backward(g)", True,
                                        contextlib.nullcontext, True)
    ROWS[f"rto_{_backend}_dynamic"] = ("a + 1 compiled with dynamic=True, torch.no_grad()",
                                       False, torch.no_grad, False)
ROWS["rto_mlp_no_grad"] = ("MLP module (3 Linear of 64, ReLU), batch 8, torch.no_grad()",
                           False, torch.no_grad, False)
ROWS["rto_mlp_training_step"] = ("the MLP module: mlp(x).sum().backward()", False,
                                 contextlib.nullcontext, True)

# row -> (function, input shape); rows not listed: one_op on a 4-vector
FUNCTIONS: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "mlp_training_step": (mlp_loss, (4, 16)),
    "inductor_mlp_training_step": (mlp_loss, (4, 16)),
    "twotensor_no_grad": (affine, (8,)),
    "twotensor_backward": (affine, (8,)),
}
for _name in [r for r in ROWS if r.startswith("rto_") and "mlp" not in r]:
    FUNCTIONS[_name] = (add_one, (2,))


def _mlp64(tag: str = "eager"):
    """The MLP, as an instance of a class of its own per variant: Dynamo
    guards a compiled module on its type, so two variants of one class would
    share one compiled entry (made with whichever switch came first)."""
    torch.manual_seed(0)
    cls = type(f"MLP64_{tag}", (torch.nn.Sequential,), {})
    return cls(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
    )


# module rows: a fresh module per variant (each compiled on its own), input shape
MODULES: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...]]] = {
    "rto_mlp_no_grad": (_mlp64, (8, 64)),
    "rto_mlp_training_step": (_mlp64, (8, 64)),
}
# rows whose input is a tensor subclass: its maker
INPUTS: dict[str, Callable] = {
    "twotensor_no_grad": _two_tensor,
    "twotensor_backward": _two_tensor,
    **{r: torch.ones for r in ROWS if r.startswith("rto_") and "mlp" not in r},
}


def backend_of(row: str) -> str:
    if row.startswith("inductor_") or row.startswith("rto_inductor") or row.startswith("rto_mlp"):
        return "inductor"
    if row.startswith("rto_eager"):
        return "eager"
    return "aot_eager"


def dynamic_of(row: str) -> bool | None:
    return True if row.endswith("_dynamic") else None


def _fresh_copy(fn, tag: str):
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


@dataclass
class E2ECase:
    name: str
    description: str
    x: torch.Tensor
    context: Callable[[], contextlib.AbstractContextManager]
    backward: bool = False
    fns: dict[str, Callable] = field(default_factory=dict)
    eager: Callable = one_op
    c_note: str | None = None
    c_stats: dict | None = None  # torch_aot_rt.stats() delta of the C compile

    def call(self, variant: str):
        fn = self.fns.get(variant)
        if fn is None:
            return None
        # an inductor floor runs the generated backward itself
        return _run(fn, self.x, self.backward and not getattr(fn, "includes_backward", False))

    def available(self):
        return tuple(v for v in E2E_VARIANTS if v in self.fns)

    def switched(self, variant: str) -> contextlib.AbstractContextManager:
        """The C runtime's switch for calls of ``variant``: the layers that
        follow it on every call (Dynamo's pregraph bytecode hooks) run
        upstream's for the upstream variant, as its compile did."""
        rt = _cases.torch_aot_rt
        if rt is None or variant in ("eager", "graph"):
            return contextlib.nullcontext()
        return rt.enabled(variant != "upstream")


def _run(fn, x, backward: bool):
    """One call of ``fn`` on ``x``, and ``.backward(g)`` of the result if asked."""
    if not backward:
        def run():
            return fn(x)

        return run
    g: list = []  # ones like the output, made at the first call (inside its context)

    def run():
        out = fn(x)
        if not g:
            g.append(torch.ones_like(out))
        out.backward(g[0])

    return run


def _march_v3_before_213() -> None:
    """torch 2.11/2.12 have no config.cpp.march: their cpp_builder writes
    -march=native into the optimization flags. The same flags with x86-64-v3
    in its place (for upstream and C alike): a benchmark-only patch."""
    import torch._inductor.cpp_builder as cpp_builder

    flags = cpp_builder._get_optimization_cflags
    if getattr(flags, "_torch_aot_rt_v3", False):
        return

    def v3(*args, **kwargs):
        cflags, ldflags = flags(*args, **kwargs)
        return ["march=x86-64-v3" if f == "march=native" else f for f in cflags], ldflags

    v3._torch_aot_rt_v3 = True
    cpp_builder._get_optimization_cflags = v3


def _compile(tag: str, flag: bool | None, x, context, warmup: int, backward=False,
             fn=one_op, backend="aot_eager", dynamic=None, module=None):
    """Compile a fresh copy of ``fn`` with the C runtime on (flag True), off
    (False), or without torch_aot_rt installed (None); return (fn, stats delta).
    With ``backward``, the warm-up calls also run the backward (compiling it)."""
    rt = _cases.torch_aot_rt
    if backend == "inductor":
        # AVX2 kernels (x86-64-v3, 256-bit vectors) on every machine: valgrind
        # (callgrind.py) cannot run AVX-512 code, which -march=native emits here
        import platform

        import torch._inductor.config as inductor_config

        inductor_config.cpp.simdlen = 256
        if platform.machine() == "x86_64":
            if hasattr(inductor_config.cpp, "march"):
                inductor_config.cpp.march = "x86-64-v3"
            else:
                _march_v3_before_213()
    def switch():
        return contextlib.nullcontext() if flag is None else rt.enabled(flag)

    before = rt.stats() if rt is not None and flag is not None else None
    with switch():  # torch.compile itself reads the switch (Dynamo's compile_wrapper)
        if module is not None:  # a module row: a module of its own
            compiled = torch.compile(module, backend=backend, dynamic=dynamic)
        else:
            compiled = torch.compile(_fresh_copy(fn, tag), backend=backend, fullgraph=True,
                                     dynamic=dynamic)
    run = _run(compiled, x, backward)
    with switch(), context():
        for _ in range(warmup):
            run()
    delta = None
    if before is not None:
        after = rt.stats()
        delta = {
            k: after[k] - before[k]
            for k in ("runtime_wrappers", "autograd_functions", "fallbacks")
        }
        delta["fallback_reasons"] = after["fallback_reasons"]
    return compiled, delta


def _graph_floor(name, fn, x, context):
    """The eager backend's graph called alone: a copy of ``fn`` compiled by
    a backend that does what ``eager`` does (returns ``gm.forward``) and
    keeps the GraphModule and its example inputs; then ``gm.forward`` called
    with them (``x`` for the tensor, the sizes as compiled), the one output
    taken from the tuple Dynamo's graph returns."""
    seen = []

    def keep(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    compiled = torch.compile(_fresh_copy(fn, f"{name}_graph"), backend=keep, fullgraph=True,
                             dynamic=dynamic_of(name))
    with context():
        compiled(x)
    (gm, example), = seen
    args = [x if isinstance(e, torch.Tensor) else e for e in example]
    forward = gm.forward

    def graph(_x):
        return forward(*args)[0]

    return graph


def _inductor_floor(name, fn, x, context, warmup, backward, module):
    """Inductor's generated code called alone: a copy compiled with the C
    runtime off; one steady-state call (and backward) records each
    ``CompiledFxGraph`` called, with its arguments; the floor calls their
    ``current_callable`` (the generated ``call``) in that order, a fresh
    list of the recorded arguments each (``call`` clears its list). No
    autograd, no AOTAutograd, no Dynamo: the kernels, allocations and the
    generated Python."""
    from torch._inductor.output_code import CompiledFxGraph

    compiled, _ = _compile(f"{name}_graph", False if _cases._C is not None else None, x,
                           context, warmup, backward, fn, "inductor", dynamic_of(name),
                           module=module)
    recorded = []
    own = CompiledFxGraph.__dict__["__call__"]

    def record(self, inputs):
        recorded.append((self.current_callable, list(inputs)))
        return own(self, inputs)

    CompiledFxGraph.__call__ = record
    try:
        with context(), (_cases.torch_aot_rt.enabled(False) if _cases.torch_aot_rt is not None
                         else contextlib.nullcontext()):
            _run(compiled, x, backward)()
    finally:
        CompiledFxGraph.__call__ = own
    if len(recorded) != (2 if backward else 1):
        # a backward inductor left to the GraphModule (a + 1's: the gradient
        # passed through), called by AOTAutograd outside CompiledFxGraph: no
        # floor measured here
        return None

    set_grad, grad_enabled = torch._C._set_grad_enabled, torch._C.is_grad_enabled

    def graph(_x):
        # as autograd runs them (a Function's forward, the engine's
        # backward): grad mode off
        prior = grad_enabled()
        set_grad(False)
        try:
            out = None
            for call, args in recorded:
                out = call(list(args))
        finally:
            set_grad(prior)
        return out

    graph.includes_backward = backward
    return graph


def build_e2e_case(name: str, *, warmup: int = 5) -> E2ECase:
    description, requires_grad, context, backward = ROWS[name]
    if name in MODULES:
        fn, shape = MODULES[name]
        eager = fn()
    else:
        fn, shape = FUNCTIONS.get(name, (one_op, (4,)))
        eager = fn
    torch.manual_seed(0)
    x = INPUTS.get(name, torch.randn)(shape).requires_grad_(requires_grad)
    case = E2ECase(name, description, x, context, backward, eager=eager)
    case.fns["eager"] = eager
    have_c = _cases._C is not None
    case.fns["upstream"], _ = _compile(
        f"{name}_upstream", False if have_c else None, x, context, warmup, backward, fn,
        backend_of(name), dynamic_of(name), module=fn("upstream") if name in MODULES else None,
    )
    if backend_of(name) == "eager":
        case.fns["graph"] = _graph_floor(name, fn, x, context)
    elif backend_of(name) == "inductor" and name.startswith("rto_"):
        floor = _inductor_floor(name, fn, x, context, warmup, backward,
                                fn("graph") if name in MODULES else None)
        if floor is not None:
            case.fns["graph"] = floor
    if not have_c:
        case.c_note = _cases.C_UNAVAILABLE
    else:
        compiled, delta = _compile(f"{name}_c", True, x, context, warmup, backward, fn,
                                   backend_of(name), dynamic_of(name),
                                   module=fn("c") if name in MODULES else None)
        case.c_stats = delta
        # with grads, the C CompiledFunction must have been built too (the
        # eager backend has no AOTAutograd: its rows measure Dynamo's layers)
        need_fn = 1 if requires_grad or backward else 0
        need_rw = 0 if backend_of(name) == "eager" else 1
        if (
            delta["runtime_wrappers"] >= need_rw
            and delta["autograd_functions"] >= need_fn * need_rw
            and delta["fallbacks"] == 0
        ):
            case.fns["c"] = compiled
        else:
            case.c_note = f"C runtime wrapper not used: stats delta {delta}"
    return case


def build_e2e_cases(names=None) -> dict[str, E2ECase]:
    # TORCH_AOT_RT_BENCH_E2E_ROWS=row,row: only those (callgrind.py passes the
    # environment to its run under valgrind, where inductor's compiles are slow)
    import os

    only = os.environ.get("TORCH_AOT_RT_BENCH_E2E_ROWS", "").strip()
    names = names or ([n for n in only.split(",") if n] if only else ROWS)
    return {n: build_e2e_case(n) for n in names}


def check_c_matches_upstream(case: E2ECase) -> tuple[bool | None, str]:
    if "c" not in case.fns:
        return None, "no C variant"
    seen = {}
    params = list(_MLP.parameters()) if case.eager is mlp_loss else []
    for variant in ("upstream", "c"):
        x = case.x.detach().clone().requires_grad_(case.x.requires_grad)
        for p in params:
            p.grad = None
        with case.context(), case.switched(variant):
            out = case.fns[variant](x)
            result = _cases.describe(out, (x,))
            grad = None
            if case.backward:
                out.backward(torch.ones_like(out))
                grad = [_cases.describe(t.grad, (x,)) for t in (x, *params)]
            seen[variant] = (
                result,
                grad,
                torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(),
            )
    if seen["upstream"] == seen["c"]:
        return True, "c == upstream"
    return False, f"MISMATCH\n  upstream: {seen['upstream']}\n  c:        {seen['c']}"
