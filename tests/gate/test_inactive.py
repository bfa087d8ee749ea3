"""Where torch_aot_rt is inactive, torch is exactly as it was.

On a torch that no release entry covers (the canary lanes of scripts/test.sh
run this on real ones), on a verified series whose mirrored code differs from
the recorded fingerprints, or where the opt-in's internals do not bind,
``import torch_aot_rt`` replaces no attribute of torch, says so once with an
``InactiveWarning``, and every compile is upstream's. On a verified torch the
same paths are reached by faking what the gate reads, in a subprocess, so
these tests run (and can fail) on every torch (those marked canary; the two
needs_c ones need a verified torch to fake a change on).
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

import _differential as D
import _fresh_python as fresh_python

from _root import ROOT  # noqa: E402

# Every code-bearing attribute (function, class, method, descriptor) of every
# torch module loaded, and of the classes they define, by identity. Plain
# data (counters, caches) is upstream's own state and changes as it runs.
_SNAPSHOT = """
def snapshot():
    import sys
    def code(v):
        return callable(v) or isinstance(v, (staticmethod, classmethod, property))
    out = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name in ("torch", "functorch") or name.startswith(("torch.", "functorch."))):
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for k, v in list(d.items()):
            if code(v):
                out[f"{name}.{k}"] = id(v)
            if isinstance(v, type) and getattr(v, "__module__", None) == name:
                for ck, cv in list(v.__dict__.items()):
                    if code(cv):
                        out[f"{name}.{k}.{ck}"] = id(cv)
    return out
"""

# The end-to-end workload: torch.compile (aot_eager) inference, a mutation, an
# aliased output, training with backward, a module; aot_function training.
_WORKLOAD = """
def workload():
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from functorch.compile import aot_function, nop

    def rec(t):
        if not isinstance(t, torch.Tensor):
            return repr(t)
        return dict(v=t.detach().tolist(), stride=list(t.stride()), off=t.storage_offset(),
                    rg=t.requires_grad, gf=type(t.grad_fn).__name__ if t.grad_fn else None,
                    ver=None if t.is_inference() else t._version,
                    view=t._base is not None, leaf=t.is_leaf)

    def f(x, y):
        y.add_(1)
        return x.sin() * y, x.view(-1), (x * 2).t()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 3)
            self.register_buffer("steps", torch.zeros(()))

        def forward(self, x):
            self.steps.add_(1)
            return torch.relu(self.lin(x))

    out = []
    torch._dynamo.reset()
    counters.clear()
    for requires_grad in (False, True):
        g = torch.compile(f, backend="aot_eager")
        for k in range(3):
            torch.manual_seed(k)
            x = torch.randn(3, 4, requires_grad=requires_grad)
            y = torch.randn(3, 4)
            res = g(x, y)
            entry = [rec(r) for r in res] + [rec(y), torch.is_grad_enabled()]
            if requires_grad:
                res[0].sum().backward()
                entry.append(rec(x.grad))
            out.append(entry)
        with torch.no_grad():
            out.append([rec(r) for r in g(torch.ones(3, 4), torch.ones(3, 4))])
        with torch.inference_mode():
            out.append([rec(r) for r in g(torch.ones(3, 4), torch.ones(3, 4))])
    m = M()
    cm = torch.compile(m, backend="aot_eager")
    for k in range(2):
        torch.manual_seed(k)
        r = cm(torch.randn(2, 4))
        r.sum().backward()
        out.append([rec(r), rec(m.steps), rec(m.lin.weight.grad)])
    a = torch.randn(3, requires_grad=True)
    r = aot_function(lambda t: (t.cos(), t[1:]), fw_compiler=nop, bw_compiler=nop)(a)
    (r[0].sum() + r[1].sum()).backward()
    out.append([rec(t) for t in r] + [rec(a.grad)])
    out.append({k: dict(v) for k, v in counters.items() if k in ("stats", "aot_autograd")})
    return out
"""

_SCRIPT = """
import json, sys, warnings
{snapshot}
{workload}
import torch, torch._dynamo
import functorch.compile
import torch._functorch._aot_autograd.runtime_wrappers
import torch._functorch.aot_autograd
import torch._dynamo.guards
{before}
result = dict(baseline=workload())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    before = snapshot()
    import torch_aot_rt
    torch_aot_rt.enable()
    torch_aot_rt.stats()
    after = snapshot()
result["warnings"] = [(w.category.__name__, str(w.message)) for w in caught
                      if "torch_aot_rt" in str(w.message)]
result["replaced"] = sorted(k for k in before if after.get(k) != before[k])
result["with_import"] = workload()
result["stats"] = torch_aot_rt.stats()
print(json.dumps(result))
"""


def run(before: str = "", **env_extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_AOT_RT", "TORCH_AOT_RT_UNVERIFIED")}
    env.update(env_extra)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    script = _SCRIPT.format(snapshot=_SNAPSHOT, workload=_WORKLOAD, before=before)
    proc = fresh_python.run(script, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_untouched(result: dict, reason_part: str) -> dict:
    """Nothing replaced, one InactiveWarning naming the reason, upstream's
    results, nothing of ours built or counted."""
    assert result["replaced"] == [], result["replaced"][:20]
    assert [c for c, _ in result["warnings"]] == ["InactiveWarning"], result["warnings"]
    assert reason_part in result["warnings"][0][1], result["warnings"]
    assert result["with_import"] == result["baseline"]
    stats = result["stats"]
    assert reason_part in stats["torch"]["inactive"], stats["torch"]
    assert stats["torch"]["release"] is None
    for key in ("runtime_wrappers", "autograd_functions", "guards", "serializable_functions",
                "params_prepends", "wrappers", "subclass_wrappers", "fallbacks"):
        assert stats[key] == 0, (key, stats)
    assert stats["cpp"]["module"] is None and stats["cpp"]["reason"], stats["cpp"]
    return stats


def _fake_unverified() -> str:
    """Code that makes the running torch unverified, where it is not."""
    if D.INACTIVE is not None or not D.IMPORT_ENABLED:
        return ""
    return "torch.__version__ = '2.99.0'"


def _fake_prerelease() -> str:
    """Code that makes the running torch a pre-release of its own series (the
    opt-in then maps it onto its own entry), where it is verified."""
    if D.INACTIVE is not None or not D.IMPORT_ENABLED:
        return ""
    major, minor = torch.__version__.split(".")[:2]
    return f"torch.__version__ = '{major}.{minor}.0a0+gitfake'"


@pytest.mark.canary
@pytest.mark.cpp_independent  # the gate
def test_import_on_unverified_torch_changes_nothing():
    fake = _fake_unverified()
    result = run(fake)
    version = "2.99.0" if fake else torch.__version__
    _check_untouched(result, f"torch {version} is not a verified version")


@pytest.mark.canary
@pytest.mark.cpp_independent  # the gate
def test_opt_in_never_breaks_a_compile():
    """TORCH_AOT_RT_UNVERIFIED=1 on any torch: whatever the gate decides, the
    compile never raises because of us and results are upstream's; where the
    internals do not bind, nothing is replaced."""
    result = run(_fake_prerelease(), TORCH_AOT_RT_UNVERIFIED="1")
    assert result["with_import"] == result["baseline"]
    stats = result["stats"]
    unverified = D.INACTIVE is not None or bool(_fake_prerelease())
    assert stats["torch"]["unverified_opt_in"] is unverified, stats["torch"]
    if stats["torch"]["inactive"] is not None:
        assert result["replaced"] == [], result["replaced"][:20]
        assert stats["runtime_wrappers"] == stats["fallbacks"] == 0, stats


@pytest.mark.canary
@pytest.mark.cpp_independent  # the gate
def test_opt_in_with_changed_signature_replaces_nothing():
    """An opt-in torch whose _create_runtime_wrapper takes other arguments: the
    internals do not bind; nothing is replaced, and the reason names it."""
    before = _fake_prerelease() + textwrap.dedent("""
        import torch._functorch._aot_autograd.runtime_wrappers as rw
        _orig = rw._create_runtime_wrapper
        def _create_runtime_wrapper(compiled_fn, *, runtime_metadata, indices_of_inps_to_detach,
                                    trace_joint, keep_input_mutations, disable_amp, extra=None):
            return _orig(compiled_fn, runtime_metadata=runtime_metadata,
                         indices_of_inps_to_detach=indices_of_inps_to_detach,
                         trace_joint=trace_joint, keep_input_mutations=keep_input_mutations,
                         disable_amp=disable_amp)
        rw._create_runtime_wrapper = _create_runtime_wrapper
    """)
    result = run(before, TORCH_AOT_RT_UNVERIFIED="1")
    _check_untouched(result, "torch internals differ")
    if D.C_ENABLED:  # elsewhere another internal may be the first to differ
        assert "_create_runtime_wrapper" in result["stats"]["torch"]["inactive"]


def _candidate():
    """The running torch is a candidate release this run opted into (2.11,
    2.12): active only under the opt-in, which skips the fingerprints."""
    from torch_aot_rt import _versions

    gate = _versions.resolve(torch.__version__)
    return gate.unverified_opt_in and gate.release in _versions.CANDIDATES


@pytest.mark.needs_c  # fakes a changed fingerprint on a verified torch
@pytest.mark.cpp_independent  # the gate
def test_changed_mirrored_code_closes_the_gate():
    """A verified series whose mirrored code is not the recorded source (a
    patch release, a rebuild, a local fix): inactive, naming the piece. A
    candidate has no recorded source (its opt-in does not check any)."""
    if _candidate():
        from torch_aot_rt import _fingerprints

        series = "%d.%d" % tuple(int(x) for x in torch.__version__.split(".")[:2])
        assert series not in _fingerprints.FINGERPRINTS
        return
    before = textwrap.dedent("""
        import os
        os.environ["TORCH_AOT_RT"] = "0"
        import torch_aot_rt._fingerprints as fp
        del os.environ["TORCH_AOT_RT"]
        series = "%d.%d" % tuple(int(x) for x in torch.__version__.split(".")[:2])
        key = "_functorch/_aot_autograd/functional_utils.py:gen_alias_from_base"
        fp.FINGERPRINTS[series] = dict(fp.FINGERPRINTS[series], **{key: "0" * 16})
    """)
    result = run(before)
    _check_untouched(
        result, "_functorch/_aot_autograd/functional_utils.py:gen_alias_from_base differs "
        "from the verified source"
    )


@pytest.mark.needs_c  # the active path's counterpart of the tests above
@pytest.mark.cpp_independent  # torch's attributes replaced: the C++ part replaces none
def test_active_import_replaces_exactly_ours():
    """Where the gate is open, the import replaces what the installer lists
    (the control for the snapshot above: it does see replacements)."""
    result = run(**({"TORCH_AOT_RT_UNVERIFIED": "1"} if _candidate() else {}))
    assert result["warnings"] == []
    assert result["with_import"] == result["baseline"]
    replaced = set(result["replaced"])
    rw = "torch._functorch._aot_autograd.runtime_wrappers"
    expected = {
        f"{rw}._create_runtime_wrapper", f"{rw}.AOTDispatchAutograd.post_compile",
        "torch._dynamo.guards.GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS",
        f"{rw}.SerializableCompiledFunction.__init__",
        "torch._functorch.aot_autograd.simple_wraps",
    }
    assert expected <= replaced, sorted(replaced)
    assert result["stats"]["runtime_wrappers"] > 0
