"""The differential harness: the same program with the C runtime off, then on.

``run_differential(fn, inputs, ...)`` compiles ``fn`` twice in this process:
once with ``torch_aot_rt`` switched off (upstream's ``_create_runtime_wrapper``
builds the wrapper) and once switched on (``torch_aot_rt._C.RuntimeWrapper``),
calls each ``calls`` times on fresh, identically seeded inputs, and compares
everything a user can observe:

* outputs: values (NaN-equal, bit for bit), dtype, shape, stride, storage
  offset, device, Python type, identity with an input, ``_base`` (an input, a
  leaf, another output, or the same anonymous intermediate), which inputs and
  outputs share storage, ``requires_grad``, ``is_leaf``, ``grad_fn`` type,
  ``_version``, ``is_inference()``, ``_dynamo_propagated_dynamic_indices`` and
  ``_dynamo_weak_dynamic_indices``;
  non-tensor outputs by type and value;
* inputs after the call: values, size, stride, storage offset, version counter
  relative to before the call, whether the storage changed, requires_grad,
  grad_fn, the dynamic-indices attribute;
* gradients after ``sum(outputs).backward()``, or the backward's exception;
* the thread-local state after the call (inside the caller's context and after
  leaving it), and the state the compiled graph itself saw while running
  (recorded by an observing compiler);
* exceptions (type and message) and warnings (category and message);
* Dynamo's graph counts (recompilations).

Each "on" run also asserts that C wrappers were really built (the builder
returned ``torch_aot_rt._C.RuntimeWrapper`` objects and ``stats()`` counted
them) and that nothing fell back unless the case says so; each "off" run
asserts that upstream built every wrapper.

With ``TORCH_AOT_RT=0`` in the environment both runs are upstream's (the
harness checks itself); the C-specific assertions are then skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo
import torch._functorch._aot_autograd.runtime_wrappers as rw
from functorch.compile import aot_function, aot_module, make_boxed_func, nop
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters as dynamo_counters

import torch_aot_rt

IMPORT_ENABLED = os.environ.get("TORCH_AOT_RT", "1").strip().lower() not in (
    "0",
    "false",
    "off",
    "no",
)
# Why the import left torch as it was (an unverified torch, a canary), or None.
INACTIVE = torch_aot_rt.stats()["torch"]["inactive"] if IMPORT_ENABLED else None
# Whether the C path runs here: "on" runs are then C, else upstream's too.
C_ENABLED = IMPORT_ENABLED and INACTIVE is None

if C_ENABLED:
    from torch_aot_rt import _C, _state

    RuntimeWrapperType: type | None = _C.RuntimeWrapper
else:  # pragma: no cover - exercised with TORCH_AOT_RT=0
    _C = None
    _state = None
    RuntimeWrapperType = None


# ---------------------------------------------------------------------------
# thread-local state


def tls_state() -> dict:
    """Every piece of thread-local state the runtime wrapper touches."""
    return {
        "grad": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "view_replay": torch._C._is_view_replay_enabled(),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "autocast_cuda": torch.is_autocast_enabled("cuda"),
        "autocast_any": torch._C._is_any_autocast_enabled(),
        "saved_hooks_disabled": torch._C._autograd._saved_tensors_hooks_get_disabled_error_message(),
        "saved_hooks_top": torch._C._autograd._top_saved_tensors_default_hooks(False)
        is not None,
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "function_modes": torch._C._len_torch_function_stack(),
    }


def restore_tls(state: dict) -> None:
    """Put back what ``tls_state`` recorded (as far as it can be set directly)."""
    torch._C._set_grad_enabled(state["grad"])
    torch._C._set_view_replay_enabled(state["view_replay"])
    torch.set_autocast_enabled("cpu", state["autocast_cpu"])
    torch.set_autocast_enabled("cuda", state["autocast_cuda"])
    msg = state["saved_hooks_disabled"]
    if msg is None:
        torch._C._autograd._saved_tensors_hooks_enable()
    else:
        torch._C._autograd._saved_tensors_hooks_disable(msg, False)
    while torch._C._len_torch_dispatch_stack() > state["dispatch_modes"]:
        torch._C._pop_torch_dispatch_stack()


# ---------------------------------------------------------------------------
# switching the C runtime


@contextlib.contextmanager
def runtime(use_c: bool):
    """Compiles inside use the C runtime (``use_c``) or upstream's."""
    if not C_ENABLED:
        yield
        return
    with torch_aot_rt.enabled(use_c):
        yield


def upstream_builder():
    """Upstream's own ``_create_runtime_wrapper``."""
    if C_ENABLED:
        return _state.installed["upstream"]
    return rw._create_runtime_wrapper


def is_c_wrapper(obj) -> bool:
    return RuntimeWrapperType is not None and isinstance(obj, RuntimeWrapperType)


class WrapperSpy:
    """Records each ``_create_runtime_wrapper`` call (kwargs and the result)
    while active; calls through to whatever builder is installed."""

    def __init__(self):
        self.records: list[dict] = []

    def __enter__(self):
        self._prev = rw._create_runtime_wrapper
        prev = self._prev

        def spy(compiled_fn, **kwargs):
            result = prev(compiled_fn, **kwargs)
            self.records.append(
                {"compiled_fn": compiled_fn, "kwargs": kwargs, "result": result}
            )
            return result

        rw._create_runtime_wrapper = spy
        return self

    def __exit__(self, *exc):
        rw._create_runtime_wrapper = self._prev
        return False


def meta_summary(kwargs: dict) -> dict:
    """The metadata of one runtime wrapper, in plain terms, for coverage checks."""
    m = kwargs["runtime_metadata"]
    return {
        "trace_joint": kwargs["trace_joint"],
        "keep_input_mutations": kwargs["keep_input_mutations"],
        "disable_amp": kwargs["disable_amp"],
        "detach": list(kwargs["indices_of_inps_to_detach"]),
        "mutated": list(m.mutated_inp_runtime_indices),
        "mutations": [
            {
                "data": m.input_info[i].mutates_data,
                "metadata": m.input_info[i].mutates_metadata,
                "storage": m.input_info[i].mutates_storage_metadata,
                "leaf": m.input_info[i].is_leaf,
            }
            for i in m.mutated_inp_runtime_indices
        ],
        "outputs": [o.output_type.name for o in m.output_info],
        "output_requires_grad": [o.requires_grad for o in m.output_info],
        "num_intermediate_bases": m.num_intermediate_bases,
        "grad_enabled_mutation": m.grad_enabled_mutation,
        "bump": list(m.mutated_graph_handled_indices_seen_by_autograd),
        "dynamic_outputs": bool(m.dynamic_outputs),
    }


# ---------------------------------------------------------------------------
# compilers


INNER: list = []  # (tag, tls_state()) per call of an observing compiled graph


def observing_compiler(tag: str = "fw", *, before=None):
    """A no-op AOT compiler whose compiled graph records the thread-local state
    it runs under (``INNER``). ``before(args)`` runs first if given (to raise,
    clear the args, ...)."""

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        def run(args):
            INNER.append((tag, tls_state()))
            if before is not None:
                before(args)
            return gm(*args)

        run._boxed_call = True
        return run

    return compiler


def observing_backend(**kwargs):
    """``aot_eager`` with observing compilers (Dynamo backend)."""
    return aot_autograd(
        fw_compiler=observing_compiler("fw"),
        bw_compiler=observing_compiler("bw"),
        keep_inference_input_mutations=True,
        **kwargs,
    )


def compile_with(how, fn, compile_kwargs: dict):
    """``how``: 'aot_function' (observing no-op compilers), 'aot_function_nop'
    (functorch.compile.nop), 'aot_module' (``fn`` is an nn.Module), a Dynamo
    backend name ('aot_eager', 'inductor', 'aot_eager_observe'), or a callable
    ``how(fn) -> compiled``."""
    if callable(how):
        return how(fn)
    if how == "aot_function":
        return aot_function(
            fn,
            fw_compiler=observing_compiler("fw"),
            bw_compiler=observing_compiler("bw"),
            **compile_kwargs,
        )
    if how == "aot_function_nop":
        return aot_function(fn, fw_compiler=nop, bw_compiler=nop, **compile_kwargs)
    if how == "aot_module":
        return aot_module(
            fn,
            fw_compiler=observing_compiler("fw"),
            bw_compiler=observing_compiler("bw"),
            **compile_kwargs,
        )
    kwargs = {"fullgraph": True, **compile_kwargs}
    backend = observing_backend() if how == "aot_eager_observe" else how
    return torch.compile(fn, backend=backend, **kwargs)


# ---------------------------------------------------------------------------
# observation


@dataclasses.dataclass
class Inputs:
    """What an inputs factory returns when it needs more than positional args:
    ``leaves`` are tensors (usually the bases of non-leaf inputs) whose
    ``.grad`` is compared after backward."""

    args: tuple
    leaves: tuple = ()


class TensorValue:
    """A tensor's values, compared NaN-equal and bit for bit."""

    def __init__(self, t: torch.Tensor):
        with torch.no_grad():
            self.t = t.detach().clone()

    def __repr__(self):
        return f"TensorValue({self.t!r})"


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError as e:  # inference tensors have no version counter
        return f"<{e}>"


def _storage_key(t: torch.Tensor):
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if s.nbytes() == 0:
        return None
    try:
        return (str(t.device), s.data_ptr())
    except RuntimeError:  # a wrapper subclass's storage has no data (its inner tensors do)
        return None


def _dynamic_attrs():
    """The attribute this release stamps output dims on (its Dynamo reads it),
    and the other release's (which nothing may write)."""
    from torch_aot_rt import _versions

    names = ("_dynamo_propagated_dynamic_indices", "_dynamo_weak_dynamic_indices")
    rel = _versions.resolve(torch.__version__).release
    ours = rel.dynamic_dims_attr if rel is not None else names[0]
    return ours, names[1] if ours == names[0] else names[0]


DYNAMIC_ATTR, OTHER_DYNAMIC_ATTR = _dynamic_attrs()


def _release():
    from torch_aot_rt import _versions

    return _versions.resolve(torch.__version__).release


# The release entry the C path runs with on this torch (None on a canary):
# tests read what it says this release does.
RELEASE = _release()
# Subclass graphs get the C subclass wrapper and C CompiledFunction (2.13 on;
# 2.12's stay upstream's, counted).
SUBCLASS_IN_C = RELEASE is None or RELEASE.subclass_wrapper_mirrored


def _dyn(t, attr=DYNAMIC_ATTR):
    v = getattr(t, attr, None)
    return None if v is None else sorted(v)


class _Labels:
    """Names objects by identity: inputs, leaves, outputs, else anonymous
    objects numbered in the order they are first met (so that two outputs
    with the same hidden ``_base`` are seen to share it in both runs)."""

    def __init__(self):
        self._by_id: dict[int, str] = {}
        self._keep: list = []
        self._anon = 0

    def add(self, obj, label):
        self._by_id.setdefault(id(obj), label)
        self._keep.append(obj)

    def name(self, obj):
        if obj is None:
            return None
        key = id(obj)
        if key not in self._by_id:
            self._by_id[key] = f"anon{self._anon}"
            self._anon += 1
            self._keep.append(obj)
        return self._by_id[key]

    def known(self, obj):
        return self._by_id.get(id(obj))


def tensor_record(t: torch.Tensor, labels: _Labels, storages: dict) -> dict:
    key = _storage_key(t)
    return {
        "pytype": type(t).__name__,
        "device": str(t.device),
        "dtype": t.dtype,
        "shape": tuple(t.shape),
        "stride": t.stride(),
        "storage_offset": t.storage_offset(),
        "requires_grad": t.requires_grad,
        "is_leaf": t.is_leaf,
        "grad_fn": None if t.grad_fn is None else type(t.grad_fn).__name__,
        "is_inference": t.is_inference(),
        "is_view": t._is_view(),
        "base": labels.name(t._base),
        "shares_storage_with": sorted(storages.get(key, ())) if key else [],
        "dynamic_indices": _dyn(t),
        "other_dynamic_indices": _dyn(t, OTHER_DYNAMIC_ATTR),
        "value": TensorValue(t),
    }


def value_record(x, labels: _Labels, storages: dict, inputs_version0=None):
    if isinstance(x, torch.Tensor):
        rec = tensor_record(x, labels, storages)
        rec["identity"] = labels.known(x)
        rec["version"] = _version(x)
        return rec
    if isinstance(x, (tuple, list)):
        return {"container": type(x).__name__,
                "items": [value_record(v, labels, storages) for v in x]}
    if isinstance(x, dict):
        return {"container": "dict",
                "items": {k: value_record(v, labels, storages) for k, v in x.items()}}
    if isinstance(x, float) and math.isnan(x):
        return {"py": "float", "value": "nan"}
    if x is None or isinstance(x, (bool, int, float, complex, str, torch.dtype, torch.SymInt)):
        return {"py": type(x).__name__, "value": repr(x)}
    # other objects: by type and identity (their repr may hold an address)
    return {"py": type(x).__name__, "object": labels.name(x)}


def _flat_tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat_tensors(v)]
    return []


def raised(f) -> BaseException:
    """The exception ``f()`` raises (the observation); fails if it returns."""
    try:
        f()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError(f"{f!r} did not raise")


def error_record(e: BaseException) -> dict:
    """An exception: its type and message (other test modules rely on these
    two keys only)."""
    return {"type": type(e).__name__, "message": str(e)}


def exception_record(e: BaseException) -> dict:
    """``error_record`` plus what the exception was raised from or during,
    and its notes."""
    ctx = e.__context__
    return {
        **error_record(e),
        "cause": None if e.__cause__ is None else exception_record(e.__cause__),
        "context": None if ctx is None or ctx is e.__cause__ else error_record(ctx),
        "notes": list(getattr(e, "__notes__", [])),
    }


# Deprecation notices fire once per process, from whatever first imports the
# module (often the first compile): they say nothing about the runtime.
_IGNORED_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning, ImportWarning)


def observe_call(
    call: Callable[[tuple], Any],
    inputs: Inputs,
    *,
    ctx: Callable[[], Any] | None = None,
    backward: bool = True,
) -> dict:
    """Call ``call(args)`` once and record everything observable."""
    args, leaves = tuple(inputs.args), tuple(inputs.leaves)
    labels = _Labels()
    for i, a in enumerate(args):
        labels.add(a, f"arg{i}")
    for i, a in enumerate(leaves):
        labels.add(a, f"leaf{i}")
    versions0 = [_version(a) if isinstance(a, torch.Tensor) else None for a in args]
    storage0 = [_storage_key(a) if isinstance(a, torch.Tensor) else None for a in args]
    tls_before = tls_state()
    INNER.clear()
    rec: dict = {}
    out = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with (ctx() if ctx is not None else contextlib.nullcontext()):
            try:
                out = call(args)
                rec["error"] = None
            except Exception as e:  # noqa: BLE001 - the exception is the observation
                rec["error"] = exception_record(e)
            rec["tls_in_ctx"] = tls_state()
        rec["tls_after"] = tls_state()
        rec["inner"] = list(INNER)
        restore_tls(tls_before)

        # storage owners, after the call (set_ may have moved an input)
        storages: dict = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and (k := _storage_key(a)):
                storages.setdefault(k, set()).add(f"arg{i}")
        for i, a in enumerate(leaves):
            if isinstance(a, torch.Tensor) and (k := _storage_key(a)):
                storages.setdefault(k, set()).add(f"leaf{i}")
        flat_out = _flat_tensors(out)
        for j, o in enumerate(flat_out):
            if labels.known(o) is None:
                labels.add(o, f"out{j}")
            if k := _storage_key(o):
                storages.setdefault(k, set()).add(f"out{j}")

        rec["outputs"] = value_record(out, labels, storages)
        rec["inputs"] = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                rec["inputs"].append({"py": type(a).__name__, "value": repr(a)})
                continue
            r = tensor_record(a, labels, storages)
            v = _version(a)
            r["version_delta"] = (
                v - versions0[i] if isinstance(v, int) and isinstance(versions0[i], int) else v
            )
            r["storage_changed"] = _storage_key(a) != storage0[i]
            rec["inputs"].append(r)

        rec["leaves"] = []
        for i, a in enumerate(leaves):
            r = tensor_record(a, labels, storages)
            r["version"] = _version(a)
            rec["leaves"].append(r)

        rec["backward"] = None
        if backward and rec["error"] is None:
            rec["backward"] = _run_backward(flat_out, args, leaves)
        rec["warnings"] = [
            (w.category.__name__, str(w.message))
            for w in caught
            if not issubclass(w.category, _IGNORED_WARNINGS)
        ]
    # drop references to this call's tensors before the next one
    del out
    return rec


def _run_backward(flat_out, args, leaves) -> dict | None:
    diff = [o for o in flat_out if o.requires_grad and o.dtype.is_floating_point]
    if not diff:
        return None
    grad_holders = [a for a in args if isinstance(a, torch.Tensor) and a.is_leaf] + list(
        leaves
    )
    res: dict = {"error": None}
    try:
        with torch.enable_grad():
            loss = sum(o.float().sum() for o in diff)
            loss.backward()
    except Exception as e:  # noqa: BLE001
        res["error"] = exception_record(e)
    res["grads"] = [
        None if t.grad is None else TensorValue(t.grad) for t in grad_holders
    ]
    return res


# ---------------------------------------------------------------------------
# comparison


class Mismatch(AssertionError):
    pass


def assert_same(a, b, path: str = "record") -> None:
    """Structural equality of two records; tensors bit-for-bit, NaN-equal."""
    if isinstance(a, TensorValue) or isinstance(b, TensorValue):
        if not (isinstance(a, TensorValue) and isinstance(b, TensorValue)):
            raise Mismatch(f"{path}: {a!r} != {b!r}")
        ta, tb = a.t, b.t
        if (ta.dtype, ta.shape, ta.device) != (tb.dtype, tb.shape, tb.device):
            raise Mismatch(
                f"{path}: tensor meta {ta.dtype}/{tuple(ta.shape)}/{ta.device} != "
                f"{tb.dtype}/{tuple(tb.shape)}/{tb.device}"
            )
        try:
            torch.testing.assert_close(
                ta, tb, rtol=0, atol=0, equal_nan=True, check_stride=False
            )
        except AssertionError as e:
            raise Mismatch(f"{path}: values differ\n{e}") from None
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            raise Mismatch(f"{path}: keys {sorted(a)} != {sorted(b)}")
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            raise Mismatch(f"{path}: length {len(a)} != {len(b)}\n  off: {a!r}\n  on:  {b!r}")
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
        return
    if a != b:
        raise Mismatch(f"{path}:\n  off: {a!r}\n  on:  {b!r}")


# ---------------------------------------------------------------------------
# the differential run


@dataclasses.dataclass
class Run:
    use_c: bool
    calls: list
    wrappers: list  # WrapperSpy records
    stats_before: dict
    stats_after: dict
    graphs: dict

    @property
    def metas(self) -> list[dict]:
        return [meta_summary(r["kwargs"]) for r in self.wrappers]

    @property
    def meta(self) -> dict:
        assert self.wrappers, "no runtime wrapper was built"
        return self.metas[0]

    def built(self, key="runtime_wrappers"):
        return self.stats_after[key] - self.stats_before[key]

    def new_fallback_reasons(self) -> dict:
        before = self.stats_before["fallback_reasons"]
        return {
            k: v - before.get(k, 0)
            for k, v in self.stats_after["fallback_reasons"].items()
            if v != before.get(k, 0)
        }


def _graph_counts() -> dict:
    stats = dynamo_counters["stats"]
    return {k: stats.get(k, 0) for k in ("unique_graphs", "calls_captured")}


_CALL_INDEX = [0]


def call_index() -> int:
    """Which call of the current run an inputs factory is making inputs for."""
    return _CALL_INDEX[0]


def _as_inputs(x) -> Inputs:
    return x if isinstance(x, Inputs) else Inputs(tuple(x))


def run_once(
    fn,
    make_inputs: Callable[[str], Any],
    *,
    use_c: bool,
    device: str = "cpu",
    compile: Any = "aot_function",
    compile_kwargs: dict | None = None,
    ctx: Callable[[], Any] | Sequence[Callable[[], Any] | None] | None = None,
    compile_ctx: Callable[[], Any] | None = None,
    calls: int = 2,
    backward: bool = True,
    functorch_config: dict | None = None,
    dynamo_config: dict | None = None,
    seed: int = 0,
    module: bool = False,
) -> Run:
    """One run (see ``run_differential``). ``module``: ``fn`` is a factory of
    an ``nn.Module``, built under a fixed seed; its parameters' gradients are
    compared with the inputs'. ``compile='aot_module'`` implies it."""
    torch._dynamo.reset()
    stats0 = torch_aot_rt.stats()
    graphs0 = _graph_counts()
    records = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(runtime(use_c))
        if functorch_config:
            stack.enter_context(torch._functorch.config.patch(**functorch_config))
        if dynamo_config:
            stack.enter_context(torch._dynamo.config.patch(**dynamo_config))
        spy = stack.enter_context(WrapperSpy())
        module = module or (isinstance(compile, str) and compile == "aot_module")
        if module:
            torch.manual_seed(seed + 10_000)
            fn = fn().to(device)
        with (compile_ctx() if compile_ctx is not None else contextlib.nullcontext()):
            compiled = compile_with(compile, fn, dict(compile_kwargs or {}))
        for k in range(calls):
            torch.manual_seed(seed + k)
            _CALL_INDEX[0] = k
            inputs = _as_inputs(make_inputs(device))
            if module:
                inputs = Inputs(
                    inputs.args, inputs.leaves + tuple(fn.parameters()) + tuple(fn.buffers())
                )
            call_ctx = ctx[k] if isinstance(ctx, (list, tuple)) else ctx
            records.append(
                observe_call(lambda a: compiled(*a), inputs, ctx=call_ctx, backward=backward)
            )
    return Run(
        use_c=use_c,
        calls=records,
        wrappers=spy.records,
        stats_before=stats0,
        stats_after=torch_aot_rt.stats(),
        graphs={k: v - graphs0[k] for k, v in _graph_counts().items()},
    )


def check_runtime_used(run: Run, *, min_wrappers: int = 1,
                       allow_fallback: str | tuple[str, ...] | None = None):
    """The run built its wrappers with the runtime it was asked for.

    With the C runtime on: every runtime wrapper is a C ``RuntimeWrapper``,
    counted in ``stats()['runtime_wrappers']``; every training graph got a C
    CompiledFunction (``stats()['autograd_functions']``); no fallback, unless
    the case names a known one (``allow_fallback``, a substring of the reason,
    or a tuple of them; then the CompiledFunction may be upstream's, the
    runtime wrapper must still be C)."""
    assert len(run.wrappers) >= min_wrappers, (
        f"expected at least {min_wrappers} runtime wrapper(s) built, got {len(run.wrappers)}"
    )
    if not C_ENABLED:
        if INACTIVE is not None:
            check_inactive(run.stats_before, run.stats_after)
        return
    c_built = [r for r in run.wrappers if is_c_wrapper(r["result"])]
    if not run.use_c:
        assert not c_built, "C wrappers were built with the C runtime disabled"
        for key in ("runtime_wrappers", "autograd_functions", "fallbacks"):
            assert run.built(key) == 0, (key, run.stats_before, run.stats_after)
        return
    reasons = run.new_fallback_reasons()
    n_training = sum(1 for r in run.wrappers if r["kwargs"]["trace_joint"])
    if allow_fallback is None:
        assert not reasons, f"unexpected fallback(s) to upstream: {reasons}"
        assert run.built("autograd_functions") == n_training, (
            f"{n_training} training graph(s), but stats()['autograd_functions'] grew by "
            f"{run.built('autograd_functions')}"
        )
    else:
        # a known limitation of the C path: may fall back, for this reason only
        allowed = (allow_fallback,) if isinstance(allow_fallback, str) else allow_fallback
        assert all(any(a in k for a in allowed) for k in reasons), reasons
    assert len(c_built) == len(run.wrappers), (
        f"{len(run.wrappers) - len(c_built)} runtime wrapper(s) are not C RuntimeWrappers: "
        f"{[type(r['result']) for r in run.wrappers]}; fallbacks: {reasons}"
    )
    assert run.built() == len(c_built), (
        f"stats()['runtime_wrappers'] grew by {run.built()}, "
        f"but {len(c_built)} C wrappers were built"
    )


def check_inactive(before: dict, after: dict) -> None:
    """On a torch where the import is inactive, nothing of ours was built or
    counted: every compile ran upstream's code, none of it passed through ours."""
    from torch_aot_rt import _C as c_module

    for key in ("runtime_wrappers", "autograd_functions", "guards", "serializable_functions",
                "params_prepends", "wrappers", "subclass_wrappers", "fallbacks"):
        assert after[key] == before[key] == 0, (key, before, after)
    assert after["fallback_reasons"] == {}, after["fallback_reasons"]
    assert set(c_module._node_stats().values()) <= {0}, c_module._node_stats()


def compare_runs(off: Run, on: Run) -> None:
    assert len(off.calls) == len(on.calls)
    for k, (a, b) in enumerate(zip(off.calls, on.calls)):
        assert_same(a, b, f"call[{k}]")
    assert_same(off.graphs, on.graphs, "dynamo_graphs")
    assert_same(
        [r["kwargs"]["trace_joint"] for r in off.wrappers],
        [r["kwargs"]["trace_joint"] for r in on.wrappers],
        "wrappers.trace_joint",
    )


def run_differential(
    fn,
    make_inputs,
    *,
    min_wrappers: int = 1,
    allow_fallback: str | tuple[str, ...] | None = None,
    expect_error: str | None = None,
    **kwargs,
) -> Run:
    """Run ``fn`` compiled with the C runtime off and on; assert that nothing
    observable differs and that each run used the runtime it was asked for.

    ``expect_error``: None (every call must succeed: the case really exercised
    the path it is about), or the exception type name the first call raises.
    Returns the "on" run, for case-specific assertions."""
    off = run_once(fn, make_inputs, use_c=False, **kwargs)
    check_runtime_used(off, min_wrappers=min_wrappers)
    _check_errors(off, expect_error)
    on = run_once(fn, make_inputs, use_c=True, **kwargs)
    check_runtime_used(on, min_wrappers=min_wrappers, allow_fallback=allow_fallback)
    compare_runs(off, on)
    return on


def _check_errors(run: Run, expect_error: str | None) -> None:
    """Guards the case itself (checked on upstream's run): it must do what it
    claims, so that a comparison of two identical failures cannot pass for a
    comparison of the behaviour under test."""
    first = run.calls[0]["error"]
    if expect_error is None:
        for k, c in enumerate(run.calls):
            assert c["error"] is None, f"call {k} raised upstream: {c['error']}"
            bw = c["backward"]
            assert bw is None or bw["error"] is None, f"backward {k} raised: {bw['error']}"
    else:
        assert first is not None and first["type"] == expect_error, first


# ---------------------------------------------------------------------------
# the direct route: a wrapper built from captured builder arguments


def capture_wrapper_kwargs(fn, args: Sequence, *, compiler=None, **aot_kwargs):
    """Compile ``fn`` with ``aot_function`` (upstream runtime) and return the
    ``(compiled_fn, kwargs)`` that AOTAutograd passed to
    ``_create_runtime_wrapper``."""
    compiler = compiler or nop
    with runtime(False), WrapperSpy() as spy:
        aot_function(fn, fw_compiler=compiler, bw_compiler=nop, **aot_kwargs)(*args)
    assert len(spy.records) == 1, spy.records
    rec = spy.records[0]
    return rec["compiled_fn"], dict(rec["kwargs"])


def build_pair(compiled_fn, kwargs: dict):
    """(upstream wrapper, our wrapper) built from the same builder arguments.
    Ours is built through the installed ``_create_runtime_wrapper`` with the C
    runtime on and must be a C ``RuntimeWrapper``."""
    up = upstream_builder()(compiled_fn, **kwargs)
    if not C_ENABLED:
        return up, upstream_builder()(compiled_fn, **kwargs)
    before = torch_aot_rt.stats()
    with torch_aot_rt.enabled(True):
        ours = rw._create_runtime_wrapper(compiled_fn, **kwargs)
    after = torch_aot_rt.stats()
    assert is_c_wrapper(ours), f"expected a C RuntimeWrapper, got {type(ours)}"
    assert after["runtime_wrappers"] == before["runtime_wrappers"] + 1
    assert after["fallbacks"] == before["fallbacks"]
    return up, ours


def boxed(f):
    """A boxed compiled function (takes the args list)."""
    return make_boxed_func(f)
