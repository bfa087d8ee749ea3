"""``aot_module_simplified``'s ``forward`` in C (``_C.ParamsPrepend``,
``torch_aot_rt/_params_prepend.py``), C runtime off vs on.

Everything a caller sees of the returned ``forward`` is upstream's: results
and gradients through the params it prepends, the attributes
``simple_wraps`` and ``aot_module_simplified`` give it, the errors of calls
that are not the plain case, and (for the boxed closure a ``GmWrapper``
gets) the emptied argument list. The closure's cells are read per call, as
the closure reads them.
"""

from __future__ import annotations

import pytest
import torch
from functorch.compile import nop
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import aot_module_simplified

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3) / 7)
        self.register_buffer("shift", torch.tensor([0.5, -1.0]))

    def forward(self, x):
        return ((x @ self.weight.t() + self.shift).relu(),)


def _traced():
    torch.manual_seed(0)
    return torch.fx.symbolic_trace(Affine())


def _attributes(fn) -> dict:
    return {
        "name": fn.__name__,
        "qualname": fn.__qualname__,
        "module": fn.__module__,
        "doc": fn.__doc__,
        "keys": sorted(k for k in vars(fn) if not k.startswith("__")),
        "zero_grad": fn.zero_grad.__func__ is torch.nn.Module.zero_grad,
        "named_parameters": [n for n, _ in fn.named_parameters()],
        "named_buffers": [n for n, _ in fn.named_buffers()],
        "has_wrapped": hasattr(fn, "__wrapped__"),
        "serialize": fn.serialize is None,
    }


def observe(use_c):
    gm = _traced()
    x = torch.linspace(-1, 1, 12).reshape(4, 3).requires_grad_()
    before = torch_aot_rt.stats()["params_prepends"]
    with D.runtime(use_c):
        fwd = aot_module_simplified(gm, (x,), fw_compiler=nop)
    built = torch_aot_rt.stats()["params_prepends"] - before
    seen = {"attributes": _attributes(fwd)}
    out = fwd(x)
    out[0].sum().backward()
    seen["out"] = [t.detach().clone() for t in out]
    seen["grads"] = [x.grad.clone(), gm.weight.grad.clone()]
    with torch.no_grad():
        gm.weight.mul_(2)  # the same tensor objects, read per call
    seen["after_update"] = [t.detach() for t in fwd(x)]
    seen["kwargs_error"] = D.error_record(D.raised(lambda: fwd(x=x)))
    seen["arity_error"] = D.error_record(D.raised(lambda: fwd()))
    return _values(seen), built, fwd


def _values(x):
    """Tensors in a nested record as compared values."""
    if isinstance(x, torch.Tensor):
        return D.TensorValue(x)
    if isinstance(x, (list, tuple)):
        return [_values(v) for v in x]
    if isinstance(x, dict):
        return {k: _values(v) for k, v in x.items()}
    return x


def test_same_as_upstream():
    off, built_off, fwd_off = observe(False)
    on, built_on, fwd_on = observe(True)
    assert built_off == 0 and type(fwd_off).__name__ == "function"
    if torch_aot_rt.stats()["torch"]["release"] is not None:
        assert built_on == 1 and isinstance(fwd_on, torch_aot_rt._C.ParamsPrepend)
    D.assert_same(off, on, "params_prepend")


def test_torch_compile_module():
    def run(use_c):
        torch._dynamo.reset()
        torch.manual_seed(0)
        mod = Affine()
        before = torch_aot_rt.stats()["params_prepends"]
        with D.runtime(use_c):
            compiled = torch.compile(mod, backend="aot_eager")
            x = torch.linspace(-1, 1, 12).reshape(4, 3).requires_grad_()
            outs = []
            for _ in range(3):
                (out,) = compiled(x)
                out.sum().backward()
                outs.append(out.detach())
        return _values({"outs": outs, "x_grad": x.grad, "w_grad": mod.weight.grad}), (
            torch_aot_rt.stats()["params_prepends"] - before
        )

    off, built_off = run(False)
    on, built_on = run(True)
    assert built_off == 0 and built_on >= 1
    D.assert_same(off, on, "compiled_module")


def _gm_wrapper_forward(use_c):
    """The boxed closure: what a GmWrapper (list inputs) gets."""
    def f(xs):
        return (xs[0] * 2 + xs[1],)

    gm = torch.fx.symbolic_trace(f)
    xs = [torch.ones(3), torch.arange(3.0)]
    with D.runtime(use_c):
        return aot_autograd(fw_compiler=nop)(gm, [xs])


def test_boxed_closure_clears_its_argument():
    def observe_boxed(use_c):
        fwd = _gm_wrapper_forward(use_c)
        args = [[torch.ones(3), torch.arange(3.0)]]
        out = fwd(args)
        return _values({"out": out, "args_after": args})

    D.assert_same(observe_boxed(False), observe_boxed(True), "boxed")


# ---- the C object over a closure of the same shape ------------------------


def _closure(boxed: bool, compiled_fn, params: list):
    """A closure with aot_module_simplified's forward's cells and body."""
    params_buffers_flat = params
    if boxed:
        def forward(runtime_args):
            flat_args = []
            flat_args.extend(params_buffers_flat)
            flat_args.extend(runtime_args)
            runtime_args.clear()
            if compiled_fn is None:
                raise AssertionError("compiled_fn must not be None")
            return compiled_fn(flat_args)
    else:
        def forward(*runtime_args):
            full_args = []
            full_args.extend(params_buffers_flat)
            full_args.extend(runtime_args)
            if compiled_fn is None:
                raise AssertionError("compiled_fn must not be None")
            return compiled_fn(full_args)
    return forward


def _c_over(forward, boxed):
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__))
    return torch_aot_rt._C.ParamsPrepend(
        forward, cells["compiled_fn"], cells["params_buffers_flat"], boxed
    )


@pytest.mark.parametrize("boxed", [False, True])
def test_cells_read_per_call_and_errors(boxed):
    def observe_fn(use_c):
        seen = []
        params = ["p0", "p1"]

        def compiled_fn(args):
            seen.append(("args", list(args), type(args).__name__))
            args.clear()  # a boxed compiled_fn steals its list
            return len(seen)

        fwd = _closure(boxed, compiled_fn, params)
        if use_c:
            fwd = _c_over(fwd, boxed)
        call = (lambda *a: fwd(list(a))) if boxed else fwd
        record = {"first": call("a", "b")}
        params[0] = None  # inductor's freezing does this to the same list
        params.append("p2")
        record["second"] = call("c")
        record["none_args"] = call()
        if boxed:
            empty = []
            record["empty_list"] = (fwd(empty), empty)
        record["kwargs"] = D.error_record(D.raised(lambda: fwd(x=1)))
        if boxed:
            record["tuple_arg"] = D.error_record(D.raised(lambda: fwd(("a",))))
            record["two_args"] = D.error_record(D.raised(lambda: fwd([1], [2])))
        record["seen"] = seen
        return record

    D.assert_same(observe_fn(False), observe_fn(True), "closure")


@pytest.mark.parametrize("boxed", [False, True])
def test_compiled_fn_none_raises_upstreams_error(boxed):
    def observe_fn(use_c):
        fwd = _closure(boxed, None, [1])
        if use_c:
            fwd = _c_over(fwd, boxed)
        args = [2]
        e = D.raised(lambda: fwd(args) if boxed else fwd(*args))
        return {"error": D.error_record(e), "args": args}

    D.assert_same(observe_fn(False), observe_fn(True), "none")


def test_constructor_checks():
    with pytest.raises(TypeError):
        torch_aot_rt._C.ParamsPrepend(len, None, None, False)
    with pytest.raises(TypeError):
        torch_aot_rt._C.ParamsPrepend()


def test_leaks_nothing_over_many_calls():
    import gc
    import sys

    params = [torch.ones(2)]
    fwd = _c_over(_closure(False, lambda args: args[0] + args[1], params), False)
    x = torch.ones(2)
    for _ in range(100):
        fwd(x)
    gc.collect()
    before = (sys.getrefcount(x), sys.getrefcount(params[0]), sys.getrefcount(fwd))
    for _ in range(1000):
        fwd(x)
    gc.collect()
    assert (sys.getrefcount(x), sys.getrefcount(params[0]), sys.getrefcount(fwd)) == before
