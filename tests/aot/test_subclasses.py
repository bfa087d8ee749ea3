"""Tensor subclasses: AOTDispatchSubclassWrapper's generated wrapper in C
(``_C.SubclassWrapper``, torch_aot_rt/_subclass_wrapper.py).

Differential, through ``torch.compile(backend="aot_eager")`` on
``TwoTensor`` (inference, training, an aliased output, a mutated subclass
input, nested subclasses, plain and subclass arguments mixed, symbolic sizes
with ``dynamic=True``), nested jagged tensors, DTensor (one-process gloo) and
AOTAutogradCache hits, training through the C CompiledFunction: the
C path off and on, everything the harness observes (values, types, strides,
aliasing, requires_grad, grad_fn, gradients), plus each subclass output's and
input's inner tensors. Direct: the wrapper upstream generates and ours, built
from the same ``post_compile`` arguments, called on the same arguments,
wrong types and odd argument lists included. References over many calls.
"""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch
from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
from torch.testing._internal.two_tensor import TwoTensor

import _differential as D
from _cache import BUNDLED_CACHE, cache_backend

pytestmark = pytest.mark.needs_c

# Training with subclasses: the C CompiledFunction, with the C subclass wrapper
# around its forward graph and the C grads wrapper in its backward; no
# fallback is allowed (the harness checks every training graph got a C
# CompiledFunction).


def _built(run) -> int:
    return run.built("subclass_wrappers")


# 2.12: the subclass wrapper and the CompiledFunction of subclass graphs stay
# upstream's, counted (its generated functions are compiled as "<name>", frames
# Dynamo may intercept); the runtime wrapper around them is still ours, so the
# differential tests run there too, allowing exactly those reasons.
IN_C = D.SUBCLASS_IN_C
UPSTREAM_REASONS = ("subclass wrapper: not mirrored for torch",
                    "CompiledFunction: a subclass graph on torch")
ALLOW = None if IN_C else UPSTREAM_REASONS
needs_subclass_c = pytest.mark.skipif(
    not IN_C, reason="the release's subclass wrapper stays upstream's (the differential "
    "tests check that it does, counted)")


def _check_built(run, training=False) -> None:
    """``run`` (the C path on) built the C subclass wrapper, or, where the
    release's stays upstream's, counted why (and for CompiledFunction too)."""
    if not D.C_ENABLED:
        return
    reasons = run.new_fallback_reasons()
    if IN_C:
        assert _built(run) >= 1, reasons
        assert not any("subclass wrapper" in k for k in reasons), reasons
        return
    assert _built(run) == 0, run.stats_after
    assert any(k.startswith(UPSTREAM_REASONS[0]) for k in reasons), reasons
    if training:
        assert any(k.startswith(UPSTREAM_REASONS[1]) for k in reasons), reasons


def _inner_flat(x) -> list:
    """The inner tensors of a subclass (recursively), in flatten order."""
    if isinstance(x, torch.Tensor) and hasattr(type(x), "__tensor_flatten__") and type(x) is not torch.Tensor:
        names, _ = x.__tensor_flatten__()
        return [t for n in names for t in [getattr(x, n), *_inner_flat(getattr(x, n))]]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _inner_flat(v)]
    return []


def _with_inner(compiled):
    """The compiled function, returning also each subclass output's inner
    tensors (so that the harness records their values, strides, storage
    sharing with the inputs' inner tensors, versions, ...)."""

    def call(*args):
        out = compiled(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return (*outs, *_inner_flat(outs))

    return call


def _compile(dynamic=False, backend="aot_eager", **kw):
    def how(fn):
        return _with_inner(torch.compile(fn, backend=backend, fullgraph=True,
                                         dynamic=dynamic, **kw))

    return how


def _two(shape, device, requires_grad=False, nested=False):
    a = torch.randn(shape, device=device)
    b = torch.randn(shape, device=device)
    if nested:
        a = TwoTensor(a, torch.randn(shape, device=device))
    t = TwoTensor(a, b)
    return t.requires_grad_() if requires_grad else t


def _inputs(*specs):
    """specs: ("two", shape, requires_grad[, nested]) or ("plain", shape, requires_grad)"""

    def make(device):
        args = []
        for kind, shape, rg, *rest in specs:
            if kind == "two":
                args.append(_two(shape, device, rg, nested=bool(rest and rest[0])))
            else:
                args.append(torch.randn(shape, device=device, requires_grad=rg))
        return D.Inputs(tuple(args), tuple(_inner_flat(args)))

    return make


def f_affine(x):
    return x * 2 + 1


def f_mixed(x, y):
    return x * y, y + 1, (x - 1).sum()


def f_alias(x):
    return x.view(-1), x * 2


def f_mutate(x):
    x.mul_(2)
    return x + 1


def f_two_outputs(x, y):
    return x + y, x * y


CASES = {
    # name: (fn, inputs, training)
    "inference": (f_affine, (("two", (8,), False),), False),
    "training": (f_affine, (("two", (8,), True),), True),
    "mixed_plain_and_subclass": (f_mixed, (("two", (4, 2), False), ("plain", (4, 2), False)), False),
    "mixed_training": (f_mixed, (("two", (4, 2), True), ("plain", (4, 2), False)), True),
    "aliased_output": (f_alias, (("two", (2, 4), False),), False),
    "aliased_output_training": (f_alias, (("two", (2, 4), True),), True),
    "mutated_input": (f_mutate, (("two", (8,), False),), False),
    "nested_subclass": (f_affine, (("two", (8,), False, True),), False),
    "nested_subclass_training": (f_two_outputs,
                                 (("two", (8,), True, True), ("two", (8,), False, True)), True),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_aot_eager(device, case, dynamic):
    fn, specs, training = CASES[case]
    on = D.run_differential(
        fn,
        _inputs(*specs),
        compile=_compile(dynamic=dynamic),
        device=device,
        calls=3,
        allow_fallback=ALLOW,
    )
    _check_built(on, training)


def test_dynamic_sizes_change(device):
    """dynamic=True, then calls with other sizes: the symbolic sizes the graph
    takes come from the subclass (x.size()[i], x.stride()[i]) each call."""
    sizes = [(8,), (5,), (11,)]

    def make(device):
        return D.Inputs((_two(sizes[D.call_index()], device),))

    on = D.run_differential(f_affine, make, compile=_compile(dynamic=True), device=device,
                            calls=3, allow_fallback=ALLOW)
    _check_built(on)


@pytest.mark.parametrize("loss", ["sum", "strided", "contiguous"])
def test_backward_sees_the_same_tangent_leaves(device, loss):
    """What the compiled backward is called with (each argument's type, shape,
    strides, values) is the same with the C backward's tangent processing
    (which coerces a TwoTensor tangent's memory format, then each inner
    tensor's, and chains the inner tensors) as with upstream's: a ``sum()``
    loss (an expanded, stride-0 tangent), a transposed one, a contiguous one
    (TwoTensor's inner tensors share its strides, so its own coercion leaves
    them contiguous)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def fn(x):
        return x * 2 + 1

    records = {}
    for use_c in (False, True):
        seen = records[use_c] = []

        def bw_compiler(gm, example_inputs):
            def run(args):
                seen.append([(type(a).__name__, tuple(a.shape), a.stride(),
                              a.detach().clone()) if isinstance(a, torch.Tensor) else repr(a)
                             for a in args])
                return gm(*args)

            run._boxed_call = True
            return run

        def fw_compiler(gm, example_inputs):
            return make_boxed_func(gm)

        torch._dynamo.reset()
        with D.runtime(use_c):
            g = torch.compile(fn, backend=aot_autograd(fw_compiler=fw_compiler,
                                                       bw_compiler=bw_compiler),
                              fullgraph=True)
            for k in range(3):
                torch.manual_seed(k)
                x = _two((4, 3), device, requires_grad=True)
                y = g(x)
                if loss == "sum":
                    y.sum().backward()
                elif loss == "strided":
                    y.backward(_two((3, 4), device).t())
                else:
                    y.backward(_two((4, 3), device))
                seen.append(("grad", type(x.grad).__name__, x.grad.a.clone(), x.grad.b.clone(),
                             x.grad.a.stride(), x.grad.b.stride()))
    _same(records[False], records[True])
    assert len(records[True]) == 6


def test_tangent_of_the_wrong_type_raises_as_upstream(device):
    """A plain output handed a subclass grad (every output summed into one
    loss): upstream's process_runtime_tangent raises on the backward; so does
    ours, with the same error, and the subclass grads that did flow agree."""

    def fn(x, y):
        return x * y, y + 1

    results = []
    for use_c in (False, True):
        torch._dynamo.reset()
        with D.runtime(use_c):
            g = torch.compile(fn, backend="aot_eager", fullgraph=True)
            for k in range(2):
                torch.manual_seed(k)
                x = _two((4,), device, requires_grad=True)
                y = torch.randn(4, device=device, requires_grad=True)
                a, b = g(x, y)
                try:
                    (a.sum() + b.sum()).backward()
                except RuntimeError as e:
                    results.append((use_c, k, type(e).__name__, str(e)))
                else:
                    results.append((use_c, k, None, None))
    off = [r[1:] for r in results if not r[0]]
    on = [r[1:] for r in results if r[0]]
    assert off == on
    assert off[0][1] == "RuntimeError", off


class Tagged(TwoTensor):
    """A TwoTensor whose flatten metadata is a tag (propagated by its ops):
    a tangent with another tag than the forward output's has other metadata,
    which process_runtime_tangent's maybe_coerce hands to
    ``__coerce_same_metadata_as_tangent__`` (or raises without it)."""

    coerce = "method"  # "method", "none" (returns None), "missing" (AttributeError)
    calls: list = []

    @staticmethod
    def __new__(cls, a, b, tag=0, outer_size=None, outer_stride=None):
        return TwoTensor.__new__(cls, a, b, outer_size, outer_stride)

    def __init__(self, a, b, tag=0, outer_size=None, outer_stride=None):
        super().__init__(a, b)
        self.tag = tag

    def __tensor_flatten__(self):
        return ["a", "b"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Tagged(inner["a"], inner["b"], meta, outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        import torch.utils._pytree as pytree
        from torch.utils._python_dispatch import return_and_correct_aliasing

        kwargs = kwargs or {}
        tag = next(x.tag for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, Tagged))
        (aa, ka), (ab, kb) = (pytree.tree_map_only(Tagged, f, (args, kwargs))
                              for f in (lambda x: x.a, lambda x: x.b))
        fa, spec = pytree.tree_flatten(func(*aa, **ka))
        fb = pytree.tree_leaves(func(*ab, **kb))
        flat = [Tagged(a, b, tag) if isinstance(a, torch.Tensor) else a for a, b in zip(fa, fb)]
        return return_and_correct_aliasing(func, args, kwargs, pytree.tree_unflatten(flat, spec))

    def __getattribute__(self, name):
        if name == "__coerce_same_metadata_as_tangent__" and Tagged.coerce == "missing":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        Tagged.calls.append((self.tag, expected_metadata, expected_type))
        if Tagged.coerce == "none":
            return None
        return Tagged(self.a, self.b, expected_metadata)


@pytest.mark.parametrize("coerce", ["method", "none", "missing"])
def test_tangent_metadata_coerced_as_upstream(coerce, monkeypatch):
    """A subclass tangent whose flatten metadata differs from the forward
    output's: the C backward calls ``__coerce_same_metadata_as_tangent__``
    with the expected metadata, as upstream's maybe_coerce, and gets the same
    gradients; where the subclass has no such method, or it returns None,
    the same error."""
    from functorch.compile import aot_function, nop

    monkeypatch.setattr(Tagged, "coerce", coerce)

    def f(x):
        return x * 2 + 1

    seen = {}
    for use_c in (False, True):
        monkeypatch.setattr(Tagged, "calls", [])
        rec = seen[use_c] = []
        before = D.torch_aot_rt.stats()
        with D.runtime(use_c):
            g = aot_function(f, fw_compiler=nop, bw_compiler=nop)
            for k in range(2):
                torch.manual_seed(k)
                x = Tagged(torch.randn(4), torch.randn(4), tag=1).requires_grad_()
                y = g(x)
                try:
                    y.backward(Tagged(torch.ones(4), torch.ones(4) * k, tag=7))
                except Exception as e:  # noqa: BLE001
                    rec.append((type(e).__name__, str(e)))
                else:
                    rec.append((type(x.grad).__name__, x.grad.tag, x.grad.a.tolist(),
                                x.grad.b.tolist()))
        rec.append(list(Tagged.calls))
        after = D.torch_aot_rt.stats()
        if use_c and IN_C:
            assert after["autograd_functions"] == before["autograd_functions"] + 1
            assert after["fallbacks"] == before["fallbacks"], after["fallback_reasons"]
        elif use_c:
            assert after["autograd_functions"] == before["autograd_functions"]
            key = next(k for k in after["fallback_reasons"] if k.startswith(UPSTREAM_REASONS[1]))
            assert after["fallback_reasons"][key] == before["fallback_reasons"].get(key, 0) + 1
    assert seen[False] == seen[True], seen
    if coerce == "method":
        assert seen[True][0][:2] == ("Tagged", 1) and seen[True][-1] == [(7, 1, None)] * 2
    else:
        assert seen[True][0][0] == "RuntimeError", seen


# ---------------------------------------------------------------------------
# nested jagged tensors


def _njt(device, requires_grad=False):
    parts = [torch.randn(n, 3, device=device) for n in (2, 4, 1)]
    nt = torch.nested.nested_tensor(parts, layout=torch.jagged)
    return nt.requires_grad_() if requires_grad else nt


def _njt_record(out, x):
    return {
        "type": type(out).__name__,
        "values": out.values().detach().clone(),
        "offsets": out.offsets().clone(),
        "shares_offsets": out.offsets() is x.offsets(),
        "ragged_idx": out._ragged_idx,
        "requires_grad": out.requires_grad,
        "grad_fn": type(out.grad_fn).__name__ if out.grad_fn is not None else None,
        "dim": out.dim(),
    }


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_nested_jagged(device, training):
    def fn(x):
        return x.sin() * 2 + 1

    results = []
    for use_c in (False, True):
        torch._dynamo.reset()
        before = D._state.counters() if D.C_ENABLED else None
        with D.runtime(use_c):
            compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
            records = []
            for k in range(3):
                torch.manual_seed(k)
                x = _njt(device, training)
                out = compiled(x)
                rec = _njt_record(out, x)
                if training:
                    out.values().sum().backward()
                    rec["grad"] = x.grad.values().clone()
                records.append(rec)
        if D.C_ENABLED and use_c:
            after = D._state.counters()
            if IN_C:
                assert after["subclass_wrappers"] > before["subclass_wrappers"], after
            else:
                key = next(k for k in after["fallback_reasons"]
                           if k.startswith(UPSTREAM_REASONS[0]))
                assert after["fallback_reasons"][key] > before["fallback_reasons"].get(key, 0)
        results.append(records)
    off, on = results
    for a, b in zip(off, on):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
            else:
                assert a[key] == b[key], (key, a[key], b[key])


# ---------------------------------------------------------------------------
# DTensor, on a one-process gloo group (in a subprocess: the process group
# and device mesh are global state)

_DTENSOR_SCRIPT = r"""
import json, os, socket, torch, torch_aot_rt
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, init_device_mesh
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
dist.init_process_group("gloo", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
runs = {}
for use_c in (False, True):
    torch._dynamo.reset()
    before = torch_aot_rt.stats()
    with torch_aot_rt.enabled(use_c):
        f = torch.compile(lambda x: (x * 2 + 1, x.sin()), backend="aot_eager", fullgraph=True)
        out = []
        for k in range(3):
            torch.manual_seed(k)
            x = DTensor.from_local(torch.randn(8, 2), mesh, [Shard(0)]).detach().requires_grad_()
            y, z = f(x)
            (y.sum() + z.sum()).backward()
            out.append([type(y).__name__, str(y.placements), y.to_local().tolist(),
                        z.to_local().tolist(), y.requires_grad, type(y.grad_fn).__name__,
                        type(x.grad).__name__, str(x.grad.placements), x.grad.to_local().tolist()])
    after = torch_aot_rt.stats()
    runs[str(use_c)] = dict(out=out, built={k: after[k] - before[k] for k in
                            ("subclass_wrappers", "autograd_functions", "runtime_wrappers")},
                            fallbacks=after["fallback_reasons"])
dist.destroy_process_group()
print(json.dumps(runs))
"""


@pytest.mark.skipif(not D.C_ENABLED, reason="needs the C path")
def test_dtensor_one_process_gloo():
    import json
    import subprocess

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    r = subprocess.run([sys.executable, "-c", _DTENSOR_SCRIPT], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    runs = json.loads(r.stdout.strip().splitlines()[-1])
    assert runs["False"]["out"] == runs["True"]["out"]
    assert runs["False"]["built"] == {"subclass_wrappers": 0, "autograd_functions": 0,
                                      "runtime_wrappers": 0}, runs["False"]
    if IN_C:
        assert runs["True"]["built"] == {"subclass_wrappers": 1, "autograd_functions": 1,
                                         "runtime_wrappers": 1}, runs["True"]
        assert runs["True"]["fallbacks"] == {}, runs["True"]
    else:
        assert runs["True"]["built"] == {"subclass_wrappers": 0, "autograd_functions": 0,
                                         "runtime_wrappers": 1}, runs["True"]
        # 2.11, 2.12: counted per compile
        expected = ["CompiledFunction: a subclass graph", "subclass wrapper: not mirrored"]
        assert sorted(k.split(" on torch")[0].split(" for torch")[0]
                      for k in runs["True"]["fallbacks"]) == sorted(expected), runs["True"]


# ---------------------------------------------------------------------------
# AOTAutogradCache


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_autograd_cache_hit(device, training):
    """A cache hit runs AOTDispatchSubclassWrapper.post_compile again: ours
    builds the C wrapper there too."""
    from torch._dynamo.utils import counters

    AOTAutogradCache.clear()
    # (2.11's bundled cache fails aot_eager compiles: inductor there)
    kw = dict(compile=_compile(backend=cache_backend()), functorch_config=BUNDLED_CACHE,
              calls=2, device=device)
    inputs = _inputs(("two", (8,), training))

    def hits():
        return counters["aot_autograd"].get("autograd_cache_hit", 0)

    miss = D.run_once(f_affine, inputs, use_c=False, **kw)
    h0 = hits()
    hit_on = D.run_once(f_affine, inputs, use_c=True, **kw)
    assert hits() == h0 + 1
    if D.C_ENABLED and IN_C:
        assert _built(hit_on) == 1, hit_on.new_fallback_reasons()
    elif D.C_ENABLED:
        _check_built(hit_on, training)
    h1 = hits()
    hit_off = D.run_once(f_affine, inputs, use_c=False, **kw)
    assert hits() == h1 + 1
    D.compare_runs(miss, hit_on)
    D.compare_runs(hit_off, hit_on)


# ---------------------------------------------------------------------------
# direct: upstream's generated wrapper and ours, from the same arguments


class _PostCompileSpy:
    """Records AOTDispatchSubclassWrapper.post_compile's arguments."""

    def __init__(self):
        self.records = []

    def __enter__(self):
        import torch._functorch._aot_autograd.runtime_wrappers as rw

        self.cls = rw.AOTDispatchSubclassWrapper
        self.prev = self.cls.__dict__["post_compile"]
        prev = self.prev

        def spy(this, compiled_fn, aot_config, *, runtime_metadata):
            self.records.append((this, compiled_fn, aot_config, runtime_metadata))
            return prev(this, compiled_fn, aot_config, runtime_metadata=runtime_metadata)

        self.cls.post_compile = spy
        return self

    def __exit__(self, *exc):
        self.cls.post_compile = self.prev


def _pair(fn, args, dynamic=False):
    """(upstream's wrapper, ours, the inner compiled graph) for fn's forward."""
    from torch_aot_rt import _subclass_wrapper

    torch._dynamo.reset()
    with D.runtime(False), _PostCompileSpy() as spy:
        torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=dynamic)(*args)
    this, compiled_fn, aot_config, meta = spy.records[-1]
    upstream = D._state.installed["replaced"]
    upstream_pc = next(r.upstream for r in upstream if r.name == "post_compile"
                       and r.owner is spy.cls)
    theirs = upstream_pc(this, compiled_fn, aot_config, runtime_metadata=meta)
    with D.runtime(True):
        ours = _subclass_wrapper.build(upstream_pc, this, compiled_fn, aot_config, meta)
    assert isinstance(ours, D._C.SubclassWrapper), ours
    return theirs, ours, compiled_fn


def _outcome(f, *args):
    try:
        out = f(*args)
    except Exception as e:  # noqa: BLE001
        return ("raised", type(e).__name__, str(e))
    return ("returned", _describe(out))


def _describe(x):
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, [_describe(v) for v in x])
    if isinstance(x, torch.Tensor):
        inner = [_describe(t) for t in _inner_flat([x])]
        return (type(x).__name__, tuple(x.shape), x.stride(), x.detach().clone() if type(x) is torch.Tensor
                else None, inner)
    return (type(x).__name__, x)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        return
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert a == b, (a, b)


@needs_subclass_c
@pytest.mark.skipif(not D.C_ENABLED, reason="needs the C path")
def test_direct_identity_and_errors(device):
    """Ours and upstream's generated wrapper on the same calls: the plain
    call, a wrong subclass type (the generated assertion), a trailing extra
    argument (passed through), an args list too short, a tuple (no clear())."""
    x = _two((8,), device)
    theirs, ours, compiled_fn = _pair(f_affine, (x,))
    # the generated function's identity: update_wrapper(fn, compiled_fn)
    assert ours._boxed_call is True and theirs._boxed_call is True
    assert ours.__wrapped__ is theirs.__wrapped__ is compiled_fn
    for name in ("__name__", "__qualname__", "__module__", "__doc__"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert {k: v for k, v in vars(ours).items() if not k.startswith("__")} == {
        k: v for k, v in vars(theirs).items() if not k.startswith("__")
    }

    def fresh():
        torch.manual_seed(0)
        return _two((8,), device)

    for make in (
        lambda: [fresh()],
        lambda: [torch.zeros(8, device=device)],        # not a TwoTensor
        lambda: [],                                       # too short
        lambda: (fresh(),),                               # a tuple: no clear()
    ):
        a, b = make(), make()
        _same(_outcome(theirs, a), _outcome(ours, b))
        _same(_describe(a), _describe(b))  # what is left of the args list


@needs_subclass_c
@pytest.mark.skipif(not D.C_ENABLED, reason="needs the C path")
def test_direct_signature_errors(device):
    x = _two((8,), device)
    theirs, ours, _ = _pair(f_affine, (x,))
    for call in (lambda f: f(), lambda f: f([x], [x]), lambda f: f([x], y=1),
                 lambda f: f(y=[x])):
        _same(_outcome(call, theirs), _outcome(call, ours))
    y = _two((8,), device)
    _same(_outcome(lambda: theirs(args=[y])), _outcome(lambda: ours(args=[y])))


@pytest.mark.skipif(not D.C_ENABLED, reason="needs the C path")
def test_plan_validation():
    from torch_aot_rt import _C
    from torch_aot_rt._kinds import SC_APPEND, SC_OUT

    base = dict(n_inputs=1, n_regs=1, unwrap=(), wrap=(), results=(), cursor=False, saved=0,
                count_check=None, final_check=False, tail=0, tail_n=0, asserts=True,
                wrap_only=False)
    with pytest.raises(ValueError, match="read before it is written"):
        _C.SubclassWrapper(lambda a: a, **{**base, "unwrap": ((SC_APPEND, 0, 0, 0, 0, None, None, ()),)})
    with pytest.raises(ValueError, match="not a wrap instruction"):
        _C.SubclassWrapper(lambda a: a, **{**base, "wrap": ((SC_APPEND, 0, 0, 0, 0, None, None, ()),)})
    with pytest.raises(ValueError, match="unknown op"):
        _C.SubclassWrapper(lambda a: a, **{**base, "wrap": ((99, 0, 0, 0, 0, None, None, ()),)})
    with pytest.raises(ValueError, match="results"):
        _C.SubclassWrapper(lambda a: a, **{**base, "results": (0,)})
    with pytest.raises(ValueError, match="count_check"):
        _C.SubclassWrapper(lambda a: a, **{**base, "count_check": (1, 2)})
    ok = _C.SubclassWrapper(lambda a: [7, 8], **{**base, "wrap": ((SC_OUT, 0, 1, 0, 0, None, None, ()),),
                                                "results": (0,)})
    assert ok([]) == (8,)


# ---------------------------------------------------------------------------
# TORCH_TRACE: the subclass_wrapper artifact


@needs_subclass_c
@pytest.mark.skipif(not D.C_ENABLED, reason="needs the C path")
def test_trace_artifact_in_upstreams_place(monkeypatch, device):
    """Where upstream logs the generated source as ``subclass_wrapper`` (its own
    artifact on 2.13/2.14, a ``# subclass_wrapper`` block of 2.15's aggregated
    one), the C path logs the description of its program."""
    import torch._logging

    seen = {}
    for use_c in (False, True):
        calls = seen[use_c] = []

        def fake(kind, metadata_fn=None, payload_fn=None, **kw):
            if kind == "artifact" and metadata_fn is not None:
                name = metadata_fn().get("name")
                calls.append((name, str(payload_fn()) if payload_fn is not None else ""))

        monkeypatch.setattr(torch._logging, "trace_structured", fake)
        torch._dynamo.reset()
        with D.runtime(use_c):
            torch.compile(f_affine, backend="aot_eager", fullgraph=True)(_two((8,), device))
        monkeypatch.undo()

    def subclass_payloads(calls):
        out = []
        for name, payload in calls:
            if name == "subclass_wrapper":
                out.append(payload)
            elif "# subclass_wrapper\n" in payload:
                out.append(payload.split("# subclass_wrapper\n", 1)[1])
        return out

    theirs, ours = subclass_payloads(seen[False]), subclass_payloads(seen[True])
    assert len(theirs) == len(ours) == 1, (seen[False], seen[True])
    assert "def inner_fn(args):" in theirs[0]
    assert "SubclassWrapper" in ours[0] and "__tensor_unflatten__" in ours[0], ours[0]


# ---------------------------------------------------------------------------
# fallbacks and the switch


def test_disabled_builds_upstream(device):
    torch._dynamo.reset()
    before = torch_aot_rt_stats()
    with D.runtime(False):
        torch.compile(f_affine, backend="aot_eager", fullgraph=True)(_two((8,), device))
    after = torch_aot_rt_stats()
    assert after["subclass_wrappers"] == before["subclass_wrappers"]


def torch_aot_rt_stats():
    import torch_aot_rt

    return torch_aot_rt.stats()


# ---------------------------------------------------------------------------
# references


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_refcounts_flat(device, training):
    x = _two((8,), device, requires_grad=training)
    torch._dynamo.reset()
    with D.runtime(True):
        g = torch.compile(f_affine, backend="aot_eager", fullgraph=True)
        for _ in range(5):
            out = g(x)
            if training:
                out.sum().backward()
    del out
    gc.collect()
    before = (sys.getrefcount(x), sys.getrefcount(x.a), sys.getrefcount(x.b))
    refs = []
    for i in range(300):
        out = g(x)
        if training and i % 10 == 0:
            out.sum().backward()
        refs.append(weakref.ref(out))
        del out
    gc.collect()
    assert (sys.getrefcount(x), sys.getrefcount(x.a), sys.getrefcount(x.b)) == before
    assert all(r() is None for r in refs)
