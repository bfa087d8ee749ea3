"""AOTAutograd's per-call layers outside the runtime wrapper, one at a time:
upstream's Python against torch_aot_rt's C, called directly.

``saved_tensors_hooks_guard``: the lambda guard Dynamo's
``GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS`` installs on every compiled frame
(upstream: its Python closure; C: ``_C.SavedHooksGuard``), each built by its own
builder (upstream's method and ours from ``torch_aot_rt/_saved_hooks_guard.py``) on a
stand-in builder that keeps the guard it is given, and called as the guard
manager calls it, ``fn(x)``, with no saved-tensor hooks active.
``serializable_call``: a ``SerializableCompiledFunction`` around a trivial
function (what an AOTAutogradCache hit puts around the compiled function),
created with the C path off (upstream's Python ``__call__``) and on (ours), called
with one argument. ``params_prepend``: ``aot_module_simplified``'s own
``forward`` closure (its code object, over one parameter and a trivial
``compiled_fn``) against ``_C.ParamsPrepend`` over the same cells, called with
one argument. ``dynamo_disable``: ``torch._dynamo.disable`` of a trivial
function (upstream's ``_fn``) against ``_C.DisabledCall`` over that wrapper,
called with one argument, default stance. ``dedupe``, ``synthetic_base``,
``effect_tokens``: the function ``AOTDedupeWrapper`` / ``AOTSyntheticBaseWrapper``
/ ``EffectTokensWrapper``'s ``post_compile`` returns (upstream's, built by
upstream's method; ours, ``_C.DedupeWrapper`` / ``SyntheticBaseWrapper`` /
``EffectTokensWrapper``, built by ``torch_aot_rt/_wrappers.py``'s) around a
trivial boxed ``compiled_fn`` that is a C callable (``functools.partial(list)``:
in a compiled program the next layer is the C runtime wrapper), called with a fresh list as the next layer
calls it: ``[x, x, y]`` compiled for a duplicate (the check, then ``[x, y]``);
two views of one tensor (one synthetic base from their ``_base``) and a
third tensor; one effect token. ``direct`` is an empty call, the loop's own
cost, except for ``subclass_*``: AOTDispatchSubclassWrapper's
per-call wrapper (upstream's generated Python, ``_C.SubclassWrapper``) around
the compiled graph of ``x * 2 + 1`` on a TwoTensor of 8 elements (a trivial
function returning that graph's outputs stands for the graph), whose
``direct`` is that function called on the inner tensors; ``subclass_own_code``
is what both wrappers spend in the subclass's own code for the output,
``TwoTensor.__tensor_unflatten__`` called alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks import _cases  # sets the TORCH_AOT_RT=0 default, loads torch_aot_rt

VARIANTS = ("direct", "upstream", "c")
ROWS = {
    "saved_tensors_hooks_guard": "Dynamo's saved-tensor-hooks guard, fn(x)",
    "serializable_call": "SerializableCompiledFunction(f)(x)",
    "params_prepend": "aot_module_simplified's forward(x), one param",
    "dynamo_disable": "torch._dynamo.disable(f)(x), as around the compiled backward",
    "dedupe": "AOTDedupeWrapper's fn([x, x, y]), one duplicate",
    "synthetic_base": "AOTSyntheticBaseWrapper's fn([a, b, y]), a, b views of one base",
    "effect_tokens": "EffectTokensWrapper's fn([x]), one token",
    "subclass_inference": "subclass wrapper, x * 2 + 1 on a TwoTensor(8), inference graph",
    "subclass_training": "subclass wrapper, x * 2 + 1 on a TwoTensor(8), training forward graph",
    "subclass_own_code": "what both wrappers call of TwoTensor's own per output: "
                         "TwoTensor.__tensor_unflatten__(inner, meta, size, stride) (no C variant)",
}


class _Root:
    def __init__(self):
        self.guards: list = []

    def add_lambda_guard(self, fn, code_parts, user_stack):
        self.guards.append(fn)


class _Builder:
    """What the builder methods use of a GuardBuilder."""

    def __init__(self):
        self.guard_manager = type("GuardManager", (), {})()
        self.guard_manager.root = _Root()

    def _set_guard_export_info(self, guard, code):
        pass


class _Guard:
    user_stack = None
    stack = None

    def __getattr__(self, name):
        return None


def _built_guard(method) -> Callable:
    builder = _Builder()
    method(builder, _Guard())
    (fn,) = builder.guard_manager.root.guards
    return fn


@dataclass
class LayerCase:
    name: str
    runs: dict[str, Callable[[], Any]] = field(default_factory=dict)
    c_note: str | None = None

    def call(self, variant: str):
        return self.runs.get(variant)

    def available(self):
        return tuple(v for v in VARIANTS if v in self.runs)


def _guard_runs(rt):
    from torch_aot_rt import _install, _state

    _install.install()
    (replaced,) = [
        r for r in _state.installed["replaced"] if r.name == "AUTOGRAD_SAVED_TENSORS_HOOKS"
    ]
    up_fn = _built_guard(replaced.upstream)
    with rt.enabled(True):
        c_fn = _built_guard(replaced.ours)
    ok = isinstance(c_fn, _cases._C.SavedHooksGuard)
    return (lambda: up_fn(None)), (lambda: c_fn(None)) if ok else None


def _serializable_runs(rt):
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    def trivial(x):
        return x

    with rt.enabled(False):
        up_fn = rw.SerializableCompiledFunction(trivial, lambda: None)
    with rt.enabled(True):
        c_fn = rw.SerializableCompiledFunction(trivial, lambda: None)
    ok = isinstance(type(c_fn).__dict__.get("__call__"), _cases._C.SerializableCall)
    return (lambda: up_fn(1)), (lambda: c_fn(1)) if ok else None


def _prepend_runs(rt):
    import types

    import torch
    import torch._functorch.aot_autograd as aot_autograd

    code = next(
        c for c in aot_autograd.aot_module_simplified.__code__.co_consts
        if isinstance(c, types.CodeType) and c.co_name == "forward" and c.co_argcount == 0
    )

    def trivial(args):
        return args

    cells = {"compiled_fn": types.CellType(trivial),
             "params_buffers_flat": types.CellType([torch.ones(1)])}
    up_fn = types.FunctionType(code, aot_autograd.__dict__, "forward", None,
                               tuple(cells[n] for n in code.co_freevars))
    c_fn = _cases._C.ParamsPrepend(up_fn, cells["compiled_fn"], cells["params_buffers_flat"],
                                   False)
    return (lambda: len(up_fn(1))), (lambda: len(c_fn(1)))


def _disable_runs(rt):
    import torch

    def trivial(x):
        return x

    up_fn = torch._dynamo.disable(trivial, reason="benchmark")
    if rt.stats()["dynamo_disable"]["unavailable"] is not None:
        return (lambda: up_fn(1)), None
    c_fn = _cases._C.DisabledCall(up_fn)
    return (lambda: up_fn(1)), (lambda: c_fn(1))


def _wrapper_pair(rt, cls, make_wrapper, meta):
    """(upstream's function, ours) from ``cls.post_compile`` on the same wrapper."""
    import functools
    import types

    from torch_aot_rt import _install, _state

    _install.install()
    (replaced,) = [r for r in _state.installed["replaced"]
                   if r.owner is cls and r.name == "post_compile"]

    # a C callable, as the next layer is in practice (the C runtime wrapper):
    # from C, calling a Python function costs a new interpreter frame that a
    # Python caller does not pay, and would dominate the comparison
    trivial = functools.partial(list)
    trivial._boxed_call = True
    config = types.SimpleNamespace(aot_id=0, num_params_buffers=0)
    up_fn = replaced.upstream(make_wrapper(), trivial, config, runtime_metadata=meta)
    with rt.enabled(True):
        c_fn = replaced.ours(make_wrapper(), trivial, config, runtime_metadata=meta)
    return up_fn, c_fn


def _dedupe_runs(rt):
    import torch
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    up_fn, c_fn = _wrapper_pair(
        rt, rw.AOTDedupeWrapper,
        lambda: rw.AOTDedupeWrapper(keep_arg_mask=[True, False, True], add_dupe_map=[0, 0, 1]),
        None)
    x, y = torch.ones(1), torch.ones(2)
    ok = isinstance(c_fn, _cases._C.DedupeWrapper)
    return (lambda: len(up_fn([x, x, y]))), (lambda: len(c_fn([x, x, y]))) if ok else None


class NotOnThisRelease(Exception):
    """The layer is upstream's on this torch release (its entry says so): no row."""


def _synthetic_base_runs(rt):
    import torch
    import torch._functorch._aot_autograd.runtime_wrappers as rw
    from torch_aot_rt import _state

    if "AOTSyntheticBaseWrapper" in _state.release().closure_compiler_wrappers:
        raise NotOnThisRelease("upstream's closure on this release (merge_view_inputs per call)")

    def make():
        w = rw.AOTSyntheticBaseWrapper(trace_joint=False)
        w.base_groups[0] = [0, 1]
        w.other_arg_indices = [2]
        return w

    up_fn, c_fn = _wrapper_pair(rt, rw.AOTSyntheticBaseWrapper, make, None)
    root = torch.ones(4)
    a, b, y = root[:2], root[2:], torch.ones(1)
    ok = isinstance(c_fn, _cases._C.SyntheticBaseWrapper)
    return (lambda: len(up_fn([a, b, y]))), (lambda: len(c_fn([a, b, y]))) if ok else None


def _effect_tokens_runs(rt):
    import types

    import torch
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    meta = types.SimpleNamespace(tokens={0: None})
    up_fn, c_fn = _wrapper_pair(rt, rw.EffectTokensWrapper, rw.EffectTokensWrapper, meta)
    x = torch.ones(1)
    ok = isinstance(c_fn, _cases._C.EffectTokensWrapper)
    return (lambda: len(up_fn([x]))), (lambda: len(c_fn([x]))) if ok else None


def _subclass_runs(rt, training: bool):
    """AOTDispatchSubclassWrapper.post_compile's wrapper, upstream's generated
    Python and ours, built from the same arguments (captured from a compile of
    ``x * 2 + 1`` on a TwoTensor of 8 elements, requiring grad for the training
    forward, whose wrapper also returns the activations), around a trivial
    function returning that graph's outputs; ``direct`` calls that function on
    the inner tensors, the baseline the overhead is measured over."""
    import torch
    from torch.testing._internal.two_tensor import TwoTensor

    import torch._functorch._aot_autograd.runtime_wrappers as rw
    from torch_aot_rt import _install, _state, _subclass_wrapper

    _install.install()
    if not _state.release().subclass_wrapper_mirrored:
        raise NotOnThisRelease("upstream's subclass wrapper on this release")
    cls = rw.AOTDispatchSubclassWrapper
    (replaced,) = [r for r in _state.installed["replaced"]
                   if r.owner is cls and r.name == "post_compile"]
    records = []

    def spy(this, compiled_fn, aot_config, *, runtime_metadata):
        records.append((this, compiled_fn, aot_config, runtime_metadata))
        return replaced.upstream(this, compiled_fn, aot_config, runtime_metadata=runtime_metadata)

    x = TwoTensor(torch.randn(8), torch.randn(8))
    if training:
        x.requires_grad_()
    cls.post_compile = spy
    try:
        with rt.enabled(False):
            torch._dynamo.reset()
            torch.compile(lambda t: t * 2 + 1, backend="aot_eager", fullgraph=True)(x)
    finally:
        cls.post_compile = replaced.ours
    this, graph, aot_config, meta = records[-1]
    a, b = x.a, x.b
    x = x.detach()
    # the graph itself is not what is measured: a trivial boxed function
    # returning the graph's outputs (a fresh list, as a graph does) stands for it
    outs = list(graph([a, b]))

    def trivial(args):
        return list(outs)

    trivial._boxed_call = True
    up_fn = replaced.upstream(this, trivial, aot_config, runtime_metadata=meta)
    with rt.enabled(True):
        c_fn = _subclass_wrapper.build(replaced.upstream, this, trivial, aot_config, meta)
    ok = isinstance(c_fn, _cases._C.SubclassWrapper)
    return ((lambda: len(trivial([a, b]))), (lambda: len(up_fn([x]))),
            (lambda: len(c_fn([x]))) if ok else None)


def _subclass_own_code_runs(rt):
    """The part of a subclass wrapper's call that is the subclass's own code,
    the same for upstream's and ours: rebuilding the output with
    ``__tensor_unflatten__``."""
    import torch
    from torch.testing._internal.two_tensor import TwoTensor

    import functools

    x = TwoTensor(torch.randn(8), torch.randn(8))
    # the call both wrappers make per TwoTensor output, with no frame of ours
    # around it (the two attribute reads per input are a few hundred Ir more)
    return functools.partial(TwoTensor.__tensor_unflatten__, {"a": x.a, "b": x.b}, None,
                             (8,), (1,)), None


_BUILDERS = {
    "subclass_own_code": _subclass_own_code_runs,
    "subclass_inference": lambda rt: _subclass_runs(rt, False),
    "subclass_training": lambda rt: _subclass_runs(rt, True),
    "saved_tensors_hooks_guard": _guard_runs,
    "serializable_call": _serializable_runs,
    "params_prepend": _prepend_runs,
    "dynamo_disable": _disable_runs,
    "dedupe": _dedupe_runs,
    "synthetic_base": _synthetic_base_runs,
    "effect_tokens": _effect_tokens_runs,
}


def build_layer_cases(names=None) -> dict[str, LayerCase]:
    cases = {}
    for name in names or ROWS:
        case = LayerCase(name)
        case.runs["direct"] = lambda: None
        cases[name] = case
        rt = _cases.torch_aot_rt
        if rt is None or _cases._C is None:
            case.c_note = _cases.C_UNAVAILABLE
            continue
        try:
            runs = _BUILDERS[name](rt)
        except NotOnThisRelease as e:
            case.c_note = str(e)
            continue
        if len(runs) == 3:  # a baseline of its own: the call the layer wraps
            case.runs["direct"], up_run, c_run = runs
        else:
            up_run, c_run = runs
        case.runs["upstream"] = up_run
        if c_run is None:
            case.c_note = "C variant not built"
        else:
            case.runs["c"] = c_run
    return cases


def check_c_matches_upstream(case: LayerCase) -> tuple[bool | None, str]:
    if "c" not in case.runs:
        return None, "no C variant"
    a, b = case.runs["upstream"](), case.runs["c"]()
    return (a == b), f"upstream {a!r}, c {b!r}"
