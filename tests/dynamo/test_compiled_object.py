"""A compiled function or module is upstream's object to every reader.

What ``torch.compile`` returns stays upstream's function object whose calls C
runs (its vectorcall; CPython 3.11: its code); each program below reads what
a program can read off it, compiled with the C path off and on, in one
process, and the two are compared: the ``functools.wraps`` attributes,
``type``, ``repr``, ``inspect.signature``/``unwrap``, ``help()``'s text,
copying and pickling, the ``_torchdynamo_*`` attributes and what follows them
(``innermost_fn``, nested ``torch.compile`` of functions, modules and bound
methods, ``torch._dynamo.disable``, ``torch.compiler.disable``,
``remove_from_cache``), the tracebacks of exceptions leaving it (file, line,
function, source line and the columns ``traceback`` underlines, for each way
out of ``compile_wrapper`` and ``OptimizedModule.__call__``), and that one in
a reference cycle with the function it compiles is collected.
"""

from __future__ import annotations

import copy
import functools
import gc
import inspect
import pickle
import pydoc
import traceback
import types
import weakref

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from torch._dynamo.eval_frame import innermost_fn
from torch.utils._python_dispatch import TorchDispatchMode

import _differential as D
import torch_aot_rt

pytestmark = pytest.mark.needs_c

X = torch.ones(3)


def f(x, scale: float = 2.0) -> torch.Tensor:
    "f's own docstring"
    return x.sin() * scale


class M(torch.nn.Module):
    def forward(self, x):
        "forward's docstring"
        return x.cos() + 1


def differential(program):
    """``program(on)`` with the C path off, then on: the same record; and
    the on run's calls went through C."""
    def run(on):
        torch._dynamo.reset()
        before = torch_aot_rt.stats()["dynamo_compile_wrapper"]["calls in C"]
        out = program(on)
        return out, torch_aot_rt.stats()["dynamo_compile_wrapper"]["calls in C"] - before

    off, _ = run(False)
    on, in_c = run(True)
    D.assert_same(off, on)
    return on, in_c


def compile_(fn, on, **kwargs):
    with D.runtime(on):
        return torch.compile(fn, **kwargs)


def _attrs(obj) -> dict:
    return {
        "type": type(obj).__name__,
        "class": obj.__class__.__name__,
        "is_function": isinstance(obj, types.FunctionType),
        "names": [getattr(obj, a, None) for a in ("__name__", "__qualname__", "__module__",
                                                  "__doc__", "__annotations__")],
        "wrapped_is_f": getattr(obj, "__wrapped__", None) is f,
        "dict": sorted(vars(obj)) if hasattr(obj, "__dict__") else None,
        "wrapper_id_is_own": getattr(obj, "_torchdynamo_wrapper_id", None) == id(obj),
        "signature": str(inspect.signature(obj)),
        "unwrap_is_f": inspect.unwrap(obj) is f,
        "repr": repr(obj).split(" at 0x")[0],
        "help": pydoc.render_doc(obj, renderer=pydoc.plaintext).split(" at 0x")[0],
        "copy": copy.copy(obj) is obj and copy.deepcopy(obj) is obj,
        "code_name": obj.__code__.co_name if hasattr(obj, "__code__") else None,
    }


def test_wraps_attributes_and_introspection():
    def program(on):
        cf = compile_(f, on, backend="eager")
        out = _attrs(cf)
        out["value"] = cf(X).tolist()
        return out

    _, in_c = differential(program)
    assert in_c >= 1


def test_unwrapping_and_nested_compile():
    def program(on):
        cnt = torch._dynamo.testing.CompileCounter()
        cf = compile_(f, on, backend=cnt)
        ccf = compile_(cf, on, backend="eager")
        out = {
            "innermost": innermost_fn(cf) is f,
            "innermost_nested": innermost_fn(ccf) is f,
            "nested": _attrs(ccf),
            "values": [cf(X).tolist(), ccf(X).tolist(), ccf(X).tolist()],
        }
        # functools.wraps over a compiled function copies its dict: the copied
        # id names the compiled function, not the wrapper, and the chain stops
        @functools.wraps(cf)
        def user_wrapper(*args, **kwargs):
            return cf(*args, **kwargs)

        out["user_wrapper_innermost"] = innermost_fn(user_wrapper) is user_wrapper
        out["frames"] = cnt.frame_count
        return out

    differential(program)


def test_disable_of_a_compiled_function_compiles_nothing():
    def program(on):
        cnt = torch._dynamo.testing.CompileCounter()
        cf = compile_(f, on, backend=cnt)
        d1 = torch._dynamo.disable(cf)
        d2 = torch.compiler.disable(cf)
        values = [d1(X).tolist(), d2(X).tolist()]
        return {"values": values, "frames": cnt.frame_count,
                "disabled_inner": innermost_fn(d1) is f, "compiled": cf(X).tolist(),
                "frames_after": cnt.frame_count}

    out, _ = differential(program)
    assert out["frames"] == 0 and out["frames_after"] == 1, out


def test_nested_compile_of_modules_and_bound_methods():
    def program(on):
        m = M()
        cm = compile_(m, on, backend="eager")
        ccm = compile_(cm, on, backend="eager")
        m2 = M()
        m2.forward = compile_(m2.forward, on, backend="eager")
        return {
            "cm_type": type(cm).__name__, "ccm_type": type(ccm).__name__,
            "ccm_is_function": isinstance(ccm, types.FunctionType),
            "values": [cm(X).tolist(), ccm(X).tolist(), m2(X).tolist()],
            "bound_doc": m2.forward.__doc__, "bound_name": m2.forward.__name__,
            "module_signature": str(inspect.signature(cm)),
            "module_call_signature": str(inspect.signature(type(cm).__call__)),
            "forward_attrs": sorted(vars(cm.forward)),
        }

    differential(program)


def test_remove_from_cache_and_recompiles():
    from torch._dynamo.eval_frame import remove_from_cache

    def program(on):
        cnt = torch._dynamo.testing.CompileCounter()
        cf = compile_(f, on, backend=cnt)
        cf(X)
        remove_from_cache(cf)
        cf(X)
        return cnt.frame_count

    differential(program)


def test_pickling_follows_upstream():
    def program(on):
        cf = compile_(f, on, backend="eager")
        try:
            restored = pickle.loads(pickle.dumps(cf))
            return {"pickled": True, "same_name": restored.__name__ == cf.__name__}
        except Exception as e:  # noqa: BLE001 - the error is the observation
            return {"pickled": False, "error": type(e).__name__}

    differential(program)


# the locals of upstream's frames that the frame behind an entry has too: the
# call's arguments and the function's closure (upstream's frame also has the
# ones its body assigns)
_FRAME_LOCALS = ("args", "kwargs", "self", "callback", "fn")


def _shape(v):
    if isinstance(v, (tuple, list)):
        return [type(x).__name__ for x in v]
    if isinstance(v, dict):
        return sorted(v)
    return type(v).__name__


def _tb(e: BaseException) -> list:
    entries = [(fs.filename.rsplit("/", 1)[-1], fs.lineno, fs.name, fs.line,
                getattr(fs, "colno", None), getattr(fs, "end_colno", None))
               for fs in traceback.extract_tb(e.__traceback__)]
    # for torch's own frames: where the function starts (what inspect and
    # pytest read its source from), and the locals above
    tb, frames = e.__traceback__, []
    while tb is not None:
        code, local = tb.tb_frame.f_code, tb.tb_frame.f_locals
        if "torch" in code.co_filename:
            frames.append((code.co_name, code.co_firstlineno,
                           len(inspect.getsource(tb.tb_frame).splitlines()),
                           {k: _shape(local[k]) for k in _FRAME_LOCALS if k in local}))
        tb = tb.tb_next
    return entries + frames


def _error_record(call) -> dict:
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the error is the observation
        return {"type": type(e).__name__, "message": str(e)[:200], "traceback": _tb(e),
                "cause": type(e.__cause__).__name__, "suppress": e.__suppress_context__,
                "context": type(e.__context__).__name__}
    return {"type": None}


def _raises(x):
    raise ValueError("from the compiled function")


def _breaks(x):
    torch._dynamo.graph_break()
    return x + 1


def _failing_backend(gm, example_inputs):
    raise RuntimeError("the backend failed")


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _RaisingModule(torch.nn.Module):
    def forward(self, x):
        raise KeyError("from forward")


@pytest.mark.parametrize("exit_", ["call", "compiler_error", "shorten", "module", "fullgraph"])
def test_tracebacks(exit_):
    """Each way an exception leaves compile_wrapper (and a compiled module's
    OptimizedModule.__call__) gives upstream's traceback entries, twice (the
    compiling call, then a steady one)."""
    if exit_ == "fullgraph" and D.RELEASE is not None and D.RELEASE.compile_wrapper_fullgraph != "raise":
        pytest.skip("fullgraph's no-compiled-frames error is raised from 2.13 on")

    def program(on):
        if exit_ == "call":
            c = compile_(_raises, on, backend="eager")
        elif exit_ == "compiler_error":
            c = compile_(_breaks, on, backend="eager", fullgraph=True)
        elif exit_ == "shorten":
            c = compile_(lambda x: x.sin(), on, backend=_failing_backend)
        elif exit_ == "module":
            c = compile_(_RaisingModule(), on, backend="eager")
        else:
            # a frame Dynamo skips (a dispatch mode is active): no compiled frame
            c = compile_(lambda x: x + 1, on, backend="eager", fullgraph=True)
            with _Passthrough():
                return [_error_record(lambda: c(X)) for _ in range(2)]
        return [_error_record(lambda: c(X)) for _ in range(2)]

    out, _ = differential(program)
    assert all(r["type"] is not None for r in out), out
    assert any(fs[0] == "eval_frame.py" for fs in out[0]["traceback"]), out


def test_compiled_function_in_a_cycle_is_collected():
    """A compiled function reachable from the function it compiles (a
    reference cycle) is freed by the collector, as upstream's is."""
    def program(on):
        def make():
            def g(x):
                return cg(x) if x.sum() < 0 else x + 1

            cg = compile_(g, on, backend="eager")
            cg(X)
            return weakref.ref(cg), weakref.ref(g)

        refs = make()
        gc.collect()
        return [r() is None for r in refs]

    out, _ = differential(program)
    assert out == [True, True], out


def test_inner_layers_leave_no_frames():
    """An exception from inside the compiled graph: the traceback is
    upstream's without the entries of the layers below compile_wrapper that
    C runs with no frame stub (Dynamo's disable wrapper around the graph,
    AOTAutograd's runtime: docs/compatibility.md), in upstream's order."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    fail = [False]

    def fw_compiler(gm, example_inputs):
        inner = make_boxed_func(gm)

        def run(args):
            if fail[0]:
                raise RuntimeError("from the graph")
            return inner(args)

        run._boxed_call = True
        return run

    def entries(on, requires_grad):
        torch._dynamo.reset()
        fail[0] = False
        # the switch as the layers below are built: at the first call
        with D.runtime(on):
            c = torch.compile(lambda x: x.sin() * 2, backend=aot_autograd(fw_compiler=fw_compiler))
            x = torch.ones(3, requires_grad=requires_grad)
            c(x)
            c(x)
        fail[0] = True
        try:
            c(x)
        except RuntimeError as e:
            return [(fs.filename, fs.name, fs.lineno)
                    for fs in traceback.extract_tb(e.__traceback__)]
        raise AssertionError("no error")

    def c_layer(entry):
        path, name, _ = entry
        return ("torch/_functorch/" in path
                or (path.endswith("_dynamo/eval_frame.py") and name == "_fn")
                # through 2.13 Function.apply is a Python classmethod
                or (path.endswith("torch/autograd/function.py") and name == "apply"))

    for requires_grad in (False, True):
        upstream, ours = entries(False, requires_grad), entries(True, requires_grad)
        assert any(c_layer(e) for e in upstream), "\n".join(map(str, upstream))
        assert ours == [e for e in upstream if not c_layer(e)], (upstream, ours)


_COMPILE_INSIDE = """
import json, warnings
import torch, torch._dynamo, torch._dynamo.testing
import torch_aot_rt
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sigmoid())

def g(x):
    model(x).sum().backward()
    return model[0].weight.grad

cnt = torch._dynamo.testing.CompileCounter()
with torch._dynamo.config.patch(compiled_autograd=True):
    cg = torch.compile(g, backend=cnt)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        grad = cg(torch.ones(2, 4))
print(json.dumps({"grad": grad.tolist(), "frames": cnt.frame_count,
                  "graph_breaks": dict(counters["graph_break"]),
                  "captures": counters["compiled_autograd"]["captures"],
                  "warnings": sorted({str(w.message)[:120] for w in seen}),
                  "in_c": torch_aot_rt.stats()["dynamo_compile_wrapper"].get("built")}))
"""


@pytest.mark.cpp_independent  # fresh interpreters, with and without the import's effect
def test_compile_inside_a_compiled_region_is_not_traced():
    """A torch.compile made while a compiled region runs (compiled autograd
    compiles the backward of a .backward() inside a compiled function): the
    frames of the package that wraps torch.compile are skipped by Dynamo as
    upstream's own are, so the graph breaks, the warnings and the results
    are those of a process where the import changed nothing."""
    import json
    import os

    import _fresh_python as fresh_python

    from _root import ROOT as root

    def run(flag):
        env = {k: v for k, v in os.environ.items() if k != "TORCH_AOT_RT"}
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        if flag is not None:
            env["TORCH_AOT_RT"] = flag
        proc = fresh_python.run(_COMPILE_INSIDE, env=env, cwd=root, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    upstream, ours = run("0"), run(None)
    assert ours.pop("in_c") >= 1 and upstream.pop("in_c") is None
    D.assert_same(upstream, ours)


def test_calls_with_keywords():
    """Positional and keyword arguments reach the function as upstream's
    compile_wrapper passes them (CPython 3.11: its code hands C the frame's
    args tuple and kwargs dict)."""
    def g(x, scale=2.0, *, shift=0):
        return x * scale + shift

    def program(on):
        c = compile_(g, on, backend="eager")
        return [c(X).tolist(), c(X, 3.0).tolist(), c(X, scale=4.0).tolist(),
                c(X, shift=1, scale=5.0).tolist(), c(x=X).tolist(),
                _error_record(lambda: c(X, bad=1))["type"]]

    _, in_c = differential(program)
    assert in_c >= 5
