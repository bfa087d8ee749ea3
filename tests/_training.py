"""Helpers for the CompiledFunction (C ``CompiledForward``/``CompiledBackward``)
tests and the training-loop tests: C runtime off vs on, in one process.

* :func:`c_runtime` switches the C runtime for the compiles inside it and
  checks, on exit, that the "on" run built C ``CompiledFunction`` classes
  (``stats()["autograd_functions"]`` grew, nothing fell back) and that the
  "off" run built none.
* :func:`compiled_function_classes` finds the ``CompiledFunction`` classes
  behind some outputs (walking their autograd graph) and :func:`is_c_class`
  says whether a class got the C forward/backward.
* :class:`RecordingBackward` is a bw_compiler that records, per call of the
  compiled backward, what it was given (values, strides, ``None``s, reference
  counts) and can raise; :func:`differential` runs a program twice and compares
  everything through ``_differential.observe_call`` plus a custom backward.
"""

from __future__ import annotations

import ast
import contextlib
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

import _differential as D
import torch_aot_rt

C_ENABLED = D.C_ENABLED

# What upstream's CompiledFunction does on this torch (its release entry, or
# 2.13's where there is none): 2.11/2.12 take the grads unboxed.
_RELEASE = __import__("torch_aot_rt._versions", fromlist=["resolve"]).resolve(
    torch.__version__).release
BOXED_BACKWARD = _RELEASE is None or _RELEASE.boxed_backward
# the backward runs in the engine's TLS `context` (2.12 on; 2.11 has no hook)
TLS_CONTEXT = _RELEASE is None or _RELEASE.backward_runs_in_tls_context
RELEASE_SERIES = _RELEASE.series if _RELEASE is not None else (2, 13)


# ---------------------------------------------------------------------------
# which runtime built a CompiledFunction


def is_c_class(cls) -> bool:
    """Whether ``cls`` (a CompiledFunction) has the C forward and backward."""
    if not C_ENABLED:
        return False
    from torch_aot_rt import _C

    fwd = cls.__dict__.get("forward")
    bwd = cls.__dict__.get("backward")
    return isinstance(getattr(fwd, "__func__", None), _C.CompiledForward) and isinstance(
        getattr(bwd, "__func__", None), _C.CompiledBackward
    )


def compiled_function_nodes(outs) -> list:
    """The CompiledFunction grad_fns reachable backwards from ``outs`` (in
    the order they are met)."""
    seen_nodes: set = set()
    nodes: list = []
    stack = [o.grad_fn for o in D._flat_tensors(outs) if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if is_compiled_function_node(node):
            nodes.append(node)
        stack.extend(fn for fn, _ in node.next_functions)
    return nodes


def compiled_function_classes(outs) -> list:
    """The CompiledFunction classes reachable backwards from ``outs`` (in
    the order they are met, without duplicates)."""
    classes: list = []
    for node in compiled_function_nodes(outs):
        if node._forward_cls not in classes:
            classes.append(node._forward_cls)
    return classes


def check_classes(outs, use_c: bool, *, expect: int | None = None, cpp_node: bool = True) -> list:
    """The CompiledFunction classes behind ``outs``, checked: C forward and
    backward exactly when ``use_c``; and their nodes the C++ node exactly
    when ``use_c`` and the C++ part is loaded (unless ``cpp_node=False``: a
    program the node hands to upstream's Function.apply)."""
    classes = compiled_function_classes(outs)
    if expect is not None:
        assert len(classes) == expect, classes
    if C_ENABLED:
        kinds = [is_c_class(c) for c in classes]
        assert all(k == use_c for k in kinds), (
            f"C runtime {'on' if use_c else 'off'}, but CompiledFunction classes with C "
            f"forward/backward: {kinds}"
        )
        want = use_c and cpp_node and cpp_node_in_use()
        nodes = [is_cpp_node(n) for n in compiled_function_nodes(outs)]
        assert all(k == want for k in nodes), (
            f"expected {'the C++ node' if want else 'upstream nodes'}, got C++ node: {nodes}"
        )
    return classes


class _Built:
    def __init__(self):
        self.functions = 0
        self.fallbacks: dict = {}


@contextlib.contextmanager
def c_runtime(use_c: bool, *, min_functions: int = 1, allow_fallback: str | None = None):
    """Compiles inside use the C runtime (``use_c``) or upstream's; on a normal
    exit, check what was built. Yields a record of the counts."""
    built = _Built()
    before = torch_aot_rt.stats()
    with D.runtime(use_c):
        yield built
    after = torch_aot_rt.stats()
    built.functions = after["autograd_functions"] - before["autograd_functions"]
    built.fallbacks = {
        k: v - before["fallback_reasons"].get(k, 0)
        for k, v in after["fallback_reasons"].items()
        if v != before["fallback_reasons"].get(k, 0)
    }
    if not C_ENABLED:
        if D.INACTIVE is not None:
            D.check_inactive(before, after)
        return
    if use_c:
        assert built.functions >= min_functions, (
            f"stats()['autograd_functions'] grew by {built.functions}, expected at least "
            f"{min_functions} C CompiledFunction classes; fallbacks: {built.fallbacks}"
        )
        if allow_fallback is None:
            assert not built.fallbacks, f"unexpected fallback(s) to upstream: {built.fallbacks}"
        else:
            assert all(allow_fallback in k for k in built.fallbacks), built.fallbacks
    else:
        assert built.functions == 0 and not built.fallbacks, (before, after)


# ---------------------------------------------------------------------------
# recording backward compiler


def arg_record(x) -> Any:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return {
            "shape": tuple(x.shape),
            "stride": x.stride(),
            "storage_offset": x.storage_offset(),
            "dtype": x.dtype,
            "requires_grad": x.requires_grad,
            "is_view": x._is_view(),
            "value": D.TensorValue(x),
        }
    return {"py": type(x).__name__, "value": repr(x)}


class RecordingBackward:
    """A bw_compiler (and fw_compiler, with ``tag='fw'``) whose compiled
    function records its arguments per call.

    ``raise_on``: a set of call numbers (0-based) on which the compiled
    function raises ``ValueError`` instead of running; ``compile_raises``:
    the compiler itself raises that many times first. ``refcounts``: record
    ``sys.getrefcount`` of each argument at entry (who else holds them).
    ``weakrefs``: keep weak references to the tensor arguments (to check
    later that they died)."""

    def __init__(self, *, raise_on=(), compile_raises: int = 0, refcounts: bool = False):
        self.compiles = 0
        self.compile_raises = compile_raises
        self.calls: list = []
        self.refcounts: list = []
        self.raise_on = set(raise_on)
        self.record_refcounts = refcounts
        self.weak: list = []
        self.fns: list = []
        self.tls: list = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.compiles += 1
        if self.compile_raises:
            self.compile_raises -= 1
            raise ValueError("bw_compiler failed on purpose")

        import weakref

        def run(args):
            k = len(self.calls)
            self.calls.append([arg_record(a) for a in args])
            self.tls.append(D.tls_state())
            if self.record_refcounts:
                # getrefcount's own argument and the comprehension variable:
                # the same in both runs
                self.refcounts.append([sys.getrefcount(a) for a in args])
            self.weak.append(
                [weakref.ref(a) if isinstance(a, torch.Tensor) else None for a in args]
            )
            if k in self.raise_on:
                raise ValueError(f"compiled backward failed on purpose (call {k})")
            return gm(*args)

        run._boxed_call = True
        self.fns.append(run)
        return run


# ---------------------------------------------------------------------------
# the differential run of one program with a custom backward


def grads_of(holders) -> list:
    return [None if t.grad is None else t.grad for t in holders]


def default_backward(outs, inputs: D.Inputs):
    """``sum(o.sum())`` over the float outputs that require grad, backward;
    returns the ``.grad`` of the leaf inputs and the leaves."""
    diff = [o for o in D._flat_tensors(outs) if o.requires_grad and o.dtype.is_floating_point]
    loss = sum(o.sum() for o in diff)
    loss.backward()
    return grads_of(leaf_holders(inputs))


def leaf_holders(inputs: D.Inputs) -> list:
    return [
        a for a in inputs.args if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad
    ] + list(inputs.leaves)


def backward_with(grad_fn: Callable, *, only=None, **kwargs):
    """A backward that calls ``torch.autograd.backward(outs, grads)`` with
    ``grads = grad_fn(outs)`` (a list, one per differentiable output used;
    ``only``: indices of the outputs used)."""

    def run(outs, inputs):
        flat = D._flat_tensors(outs)
        used = [flat[i] for i in only] if only is not None else [
            o for o in flat if o.requires_grad
        ]
        grads = grad_fn(used)
        torch.autograd.backward(used, grads, **kwargs)
        return grads_of(leaf_holders(inputs))

    return run


def _safe(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception is the observation
        return D.error_record(e)


def cpp_node_in_use() -> bool:
    """Whether CompiledFunction calls get the C++ autograd node
    (csrc/cpp/compiled_node.cpp): the C++ part is loaded."""
    return D.C_ENABLED and torch_aot_rt.stats()["cpp"]["module"] is not None


def node_stats() -> dict:
    """The C++ node's per-call decisions so far (``_C._node_stats()``)."""
    return dict(torch_aot_rt._C._node_stats()) if D.C_ENABLED else {}


def node_stats_delta(before: dict) -> dict:
    """What changed in :func:`node_stats` since ``before`` (non-zero only)."""
    after = node_stats()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def is_compiled_function_node(node) -> bool:
    """A CompiledFunction's grad_fn: upstream's BackwardCFunction, or the C++
    node (which has ``_forward_cls`` too)."""
    cls = getattr(node, "_forward_cls", None)
    return cls is not None and cls.__name__ == "CompiledFunction"


def is_cpp_node(node) -> bool:
    return type(node) is getattr(torch._C._functions, "CompiledFunctionBackward", None)


def ctx_record(outs) -> list:
    """The autograd ``ctx`` state of each CompiledFunction node reachable from
    ``outs``: its saved tensors, symints, opaque objects and the
    non-differentiable marks; and, where the C++ node is not in use (so that
    every CompiledFunction node, off and on, is a Python ctx), the ctx's
    Python attributes, the compiled-autograd key (its shape),
    ``needs_input_grad`` and the raw saved tensors, which the C++ node does
    not have (docs/compatibility.md)."""
    python_ctx = not cpp_node_in_use()
    recs = []
    seen: set = set()
    stack = [o.grad_fn for o in D._flat_tensors(outs) if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(fn for fn, _ in node.next_functions)
        if not is_compiled_function_node(node):
            continue
        rec = {
            "name": node.name(),
            "type_name": type(node).__name__,
            "symints": _safe(lambda: [repr(s) for s in node.symints]),
            "symints_type": type(node.symints).__name__,
            "opaque": _safe(lambda: [type(s).__name__ for s in node.opaque_objects]),
            "n_saved": _safe(lambda: len(node.saved_tensors)),
            "n_no_vc": _safe(lambda: len(node._tensors_no_vc_check)),
            "saved_shapes": _safe(lambda: [tuple(t.shape) for t in node.saved_tensors]),
            "saved_dynamic_dims": _safe(
                lambda: [D._dyn(t) for t in (*node.saved_tensors, *node._tensors_no_vc_check)]
            ),
            "saved_other_dynamic_dims": _safe(
                lambda: [D._dyn(t, D.OTHER_DYNAMIC_ATTR)
                         for t in (*node.saved_tensors, *node._tensors_no_vc_check)]
            ),
            "materialize_non_diff": node._materialize_non_diff_grads,
            "non_differentiable": repr(node.non_differentiable),
            "to_save": repr(node.to_save),
        }
        if python_ctx:
            cls = node._forward_cls
            key = _safe(cls._compiled_autograd_key, node)
            rec.update(
                {
                    "vars": {k: type(v).__name__ for k, v in vars(node).items()},
                    "n_raw_saved": len(node._raw_saved_tensors),
                    "needs_input_grad": node.needs_input_grad,
                    "key_types": (
                        [type(k).__name__ for k in key] if isinstance(key, tuple) else key
                    ),
                    "key_len": len(key) if isinstance(key, tuple) else None,
                }
            )
        recs.append(rec)
    return recs


class Result:
    def __init__(self, use_c):
        self.use_c = use_c
        self.calls: list = []
        self.classes: list = []
        self.extra: dict = {}
        self.built: _Built | None = None


def _compile(fn, how, recorder, compile_kwargs):
    """'aot_function_nop': aot_function with nop compilers (the recorder as
    bw_compiler if given); 'dynamo': torch.compile(fullgraph=True) with an
    aot_autograd backend of boxed nop compilers (and the recorder);
    else as ``_differential.compile_with``."""
    from functorch.compile import aot_function, nop

    if how == "aot_function_nop":
        return aot_function(fn, fw_compiler=nop, bw_compiler=recorder or nop, **compile_kwargs)
    if how == "dynamo":
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        backend = aot_autograd(fw_compiler=boxed_nop, bw_compiler=recorder or boxed_nop)
        return torch.compile(fn, backend=backend, fullgraph=True, **compile_kwargs)
    assert recorder is None, how
    return D.compile_with(how, fn, compile_kwargs)


def run_program(
    fn,
    make_inputs: Callable[[], Any],
    *,
    use_c: bool,
    backward=default_backward,
    compile: Any = "aot_function_nop",
    compile_kwargs: dict | None = None,
    bw_compiler_factory: Callable[[], Any] | None = None,
    calls: int = 2,
    ctx=None,
    seed: int = 0,
    min_functions: int = 1,
    allow_fallback: str | None = None,
    after_call: Callable | None = None,
    config: Callable | None = None,
    cpp_node: bool = True,
) -> Result:
    """Compile ``fn`` (on its first call, inside the runtime switch), call it
    ``calls`` times on fresh inputs; each call: the forward, ``ctx_record`` of
    the outputs, then ``backward(outs, inputs)`` (its result or its
    exception), all observed by ``_differential.observe_call``. ``cpp_node``:
    whether the "on" run's CompiledFunction nodes are the C++ node (where
    the C++ part is loaded), or upstream's (a program it declines)."""
    torch._dynamo.reset()
    res = Result(use_c)
    recorder = bw_compiler_factory() if bw_compiler_factory is not None else None
    res.extra["recorder"] = recorder
    with contextlib.ExitStack() as stack:
        if config is not None:
            stack.enter_context(config())
        built = stack.enter_context(
            c_runtime(use_c, min_functions=min_functions, allow_fallback=allow_fallback)
        )
        compiled = _compile(fn, compile, recorder, dict(compile_kwargs or {}))
        for k in range(calls):
            torch.manual_seed(seed + k)
            D._CALL_INDEX[0] = k
            inputs = D._as_inputs(make_inputs())

            def call(args, inputs=inputs):
                outs = compiled(*args)
                classes = check_classes(outs, use_c, cpp_node=cpp_node)
                for c in classes:
                    if c not in res.classes:
                        res.classes.append(c)
                ctx_before = ctx_record(outs)
                bw = None
                if backward is not None:
                    bw = _safe(backward, outs, inputs)
                extra = after_call(outs, inputs) if after_call is not None else None
                return {"outs": outs, "ctx": ctx_before, "backward": bw, "extra": extra}

            call_ctx = ctx[k] if isinstance(ctx, (list, tuple)) else ctx
            res.calls.append(D.observe_call(call, inputs, ctx=call_ctx, backward=False))
        res.extra["compiled"] = compiled
    res.built = built
    return res


def differential(fn, make_inputs, *, expect_error: str | None = None,
                 backward_error: str | None = None, **kwargs) -> tuple[Result, Result]:
    """``fn`` with the C runtime off, then on; everything observed must be
    the same. ``backward_error``: the backward of the first call must raise
    this exception type upstream (guards the case itself)."""
    off = run_program(fn, make_inputs, use_c=False, **kwargs)
    on = run_program(fn, make_inputs, use_c=True, **kwargs)
    first = off.calls[0]
    if expect_error is None:
        assert first["error"] is None, f"the forward raised upstream: {first['error']}"
        bw = first["outputs"]["items"]["backward"]
        got = backward_error_type(bw)
        assert got == backward_error, f"upstream's backward: expected {backward_error}, got {bw}"
    else:
        assert first["error"] is not None and first["error"]["type"] == expect_error, first
    D.assert_same(off.calls, on.calls, "calls")
    rec_off, rec_on = off.extra.get("recorder"), on.extra.get("recorder")
    if isinstance(rec_off, RecordingBackward):
        D.assert_same(rec_off.calls, rec_on.calls, "compiled_backward_args")
        D.assert_same(rec_off.compiles, rec_on.compiles, "bw_compiles")
        D.assert_same(rec_off.tls, rec_on.tls, "compiled_backward_tls")
        if rec_off.record_refcounts:
            D.assert_same(rec_off.refcounts, rec_on.refcounts, "compiled_backward_arg_refcounts")
    return off, on


def backward_error_type(bw_record) -> str | None:
    """The exception type name in an observed backward result, or None."""
    if isinstance(bw_record, dict) and bw_record.get("container") == "dict":
        items = bw_record["items"]
        if set(items) == {"type", "message"}:
            return ast.literal_eval(items["type"]["value"])
    return None


# ---------------------------------------------------------------------------
# inputs


def leaf(*shape, requires_grad=True, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad)


def nonleaf(*shape):
    """A non-leaf input (``leaf.clone()``) whose leaf is returned too, for
    the leaf's grad: ``(nonleaf, leaf)``."""
    base = torch.randn(*shape, requires_grad=True)
    return base.clone(), base
