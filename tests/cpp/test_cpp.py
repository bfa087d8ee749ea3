"""The optional C++ part (csrc/cpp/, torch_aot_rt/_cpp.py).

In use wherever it was built for the running torch; never loaded into
another torch (the build record is checked before the import); switched off
by TORCH_AOT_RT_CPP=0. The whole suite runs in both configurations
(scripts/test.sh); these tests pin the loader and the states where the C++
route must hand a call back to torch's Python-visible function.
"""

from __future__ import annotations

import os

import pytest
import torch
from functorch.compile import aot_function, nop
from torch.overrides import TorchFunctionMode

import _differential as D
import torch_aot_rt
from _gate_probe import INSTALLED
from _gate_probe import run as _run
from torch_aot_rt import _cpp

SWITCHED_OFF = os.environ.get("TORCH_AOT_RT_CPP", "") == "0"
# why the C++ part is not built for this torch's series (2.11, 2.12), or None
UNSUPPORTED = _cpp.headers_unsupported(tuple(int(x) for x in torch.__version__.split(".")[:2]))


def run(remove, **extra_env):
    """test_compat.run, under this run's opt-in on a candidate release."""
    return _run(remove, **{**INSTALLED, **extra_env})


@pytest.mark.needs_c
def test_cpp_part_in_use_unless_switched_off():
    info = torch_aot_rt.stats()["cpp"]
    if SWITCHED_OFF:
        assert info == {"module": None, "reason": "switched off (TORCH_AOT_RT_CPP=0)"}
    elif UNSUPPORTED is not None:
        # a verified release whose headers the C++ part does not build against
        # (2.12): the C core alone, and why
        assert info["module"] is None and UNSUPPORTED in info["reason"], info
    else:
        # scripts/test.sh builds it for every release it tests
        assert info == {"module": _cpp.module_name(str(torch.__version__)), "reason": None}


class RecordingMode(TorchFunctionMode):
    """Sees what a TorchFunctionMode sees: torch._C._set_grad_enabled and
    _set_view_replay_enabled dispatch to it; the getters do not."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


def f_inference(x):
    return (x.sin() * 2,)


def f_training(x, w):
    return (x * w,)


@pytest.mark.parametrize("grad", [True, False])
def test_setters_reach_torch_function_mode_inference(grad):
    """Inference graph called with grad on: upstream turns grad off and on
    through torch._C._set_grad_enabled, which an active mode intercepts."""
    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        with D.runtime(use_c):
            g = aot_function(f_inference, fw_compiler=nop, bw_compiler=nop)
            g(torch.randn(3))
        mode = RecordingMode()
        with torch.set_grad_enabled(grad), mode:
            (out,) = g(torch.randn(3))
            after = torch.is_grad_enabled()
        results[use_c] = (mode.seen, after, out.requires_grad)
    assert results[False] == results[True], results
    if grad:
        assert results[False][0].count("_set_grad_enabled") == 2, results[False]


def test_setters_reach_torch_function_mode_training():
    """Training graph: view replay on and off again (and enable_grad)."""
    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        with D.runtime(use_c):
            g = aot_function(f_training, fw_compiler=nop, bw_compiler=nop)
            g(x, w)
        mode = RecordingMode()
        with mode:
            (out,) = g(x, w)
            state = (torch.is_grad_enabled(), torch._C._is_view_replay_enabled())
        out.sum().backward()
        results[use_c] = (mode.seen, state, D.TensorValue(out), D.TensorValue(x.grad))
    D.assert_same(results[False], results[True])
    assert "_set_view_replay_enabled" in results[False][0], results[False]


def f_saves_intermediate(x):
    y = x * 2
    return (y.sin(),)  # saves y, not a graph input: its _is_view() is asked


def test_tensor_queries_reach_torch_function_mode():
    """The tensor queries the C++ part answers (_is_view, the tangent's shape
    and stride) go to an active mode as upstream's do; the mode is active in
    the forward and around the backward, with a tangent of matching strides
    and one that needs re-striding."""
    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x = torch.randn(3, 4, requires_grad=True)
        with D.runtime(use_c):
            g = aot_function(f_saves_intermediate, fw_compiler=nop, bw_compiler=nop)
            g(x)
        seen = []
        for grad in (torch.ones(3, 4), torch.ones(4, 3).t()):
            mode = RecordingMode()
            with mode:
                (out,) = g(x)
                out.backward(grad)
            seen.append((mode.seen, D.TensorValue(x.grad)))
            x.grad = None
        results[use_c] = seen
    D.assert_same(results[False], results[True])
    assert "_is_view" in results[False][0][0], results[False]


def test_grad_mode_state_after_calls():
    """The TLS itself, without a mode: grad mode and view replay as upstream
    leaves them, after a normal call and after one that raises."""

    def fw_compiler(gm, example_inputs):
        def run_graph(args):
            if args[0].shape[0] == 2:
                raise KeyError("on purpose")
            return gm(*args)

        run_graph._boxed_call = True
        return run_graph

    results = {}
    for use_c in (False, True):
        torch._dynamo.reset()
        states = []
        with D.runtime(use_c):
            g = aot_function(f_inference, fw_compiler=fw_compiler, bw_compiler=nop,
                             dynamic=True)
            g(torch.randn(3))
        for grad in (True, False):
            for n in (3, 2):
                with torch.set_grad_enabled(grad):
                    try:
                        g(torch.randn(n))
                        states.append("ok")
                    except KeyError:
                        states.append("KeyError")
                    states.append((torch.is_grad_enabled(), torch._C._is_view_replay_enabled()))
        results[use_c] = states
    assert results[False] == results[True], results


# ---- the loader, in subprocesses ------------------------------------------


def _base(version: str) -> str:
    return version.split("+")[0]


@pytest.mark.cpp_independent  # sets TORCH_AOT_RT_CPP itself
def test_record_of_another_torch_is_not_loaded():
    result = run('torch.version.git_version = "0" * 40', TORCH_AOT_RT_CPP="1")
    assert result["same"]
    cpp = result["stats"]["cpp"]
    assert cpp["module"] is None and result["loaded_cpp"] == [], result
    if UNSUPPORTED is not None:  # nothing built, no record to compare
        assert UNSUPPORTED in cpp["reason"], cpp
    else:
        assert cpp["reason"].startswith("built against another torch (git_version"), cpp
    # the C core alone still runs everything
    assert result["stats"]["runtime_wrappers"] == 1
    assert result["stats"]["autograd_functions"] == 1


@pytest.mark.cpp_independent  # sets TORCH_AOT_RT_CPP itself
def test_torch_it_was_not_built_for():
    fake = _base(str(torch.__version__)) + "+notbuilt"
    result = run(f"torch.__version__ = {fake!r}", TORCH_AOT_RT_CPP="1")
    assert result["same"]
    cpp = result["stats"]["cpp"]
    assert cpp == {
        "module": None,
        "reason": f"not built for torch {fake} (no {_cpp.record_name(fake)})",
    }, cpp
    assert result["loaded_cpp"] == []
    assert result["stats"]["runtime_wrappers"] == 1


@pytest.mark.cpp_independent  # sets TORCH_AOT_RT_CPP itself
def test_switched_off_is_not_loaded():
    result = run("", TORCH_AOT_RT_CPP="0")
    assert result["same"]
    assert result["stats"]["cpp"] == {
        "module": None, "reason": "switched off (TORCH_AOT_RT_CPP=0)"
    }
    assert result["loaded_cpp"] == []
    assert result["stats"]["runtime_wrappers"] == 1


@pytest.mark.cpp_independent  # sets TORCH_AOT_RT_CPP itself
def test_loaded_when_built():
    result = run("", TORCH_AOT_RT_CPP="1")
    name = _cpp.module_name(str(torch.__version__))
    if UNSUPPORTED is not None:
        cpp = result["stats"]["cpp"]
        assert cpp["module"] is None and UNSUPPORTED in cpp["reason"], cpp
        assert result["loaded_cpp"] == []
        return
    assert result["stats"]["cpp"] == {"module": name, "reason": None}
    assert result["loaded_cpp"] == [f"torch_aot_rt.{name}"]
