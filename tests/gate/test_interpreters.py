"""The gate per interpreter: (torch release, CPython minor version, build kind).

On a pair the gate does not verify, and on any build of CPython but the
default one (free-threaded: loading the extension would switch the GIL back
on), ``import torch_aot_rt`` leaves torch untouched with one
``InactiveWarning`` saying why; on a build other than the default the C
extension is not even loaded, and setup.py builds none. The running
interpreter is whatever this suite runs on; the others are made by faking
what the gate reads (``_versions.build_kind``, a release's ``pythons``,
``sysconfig``'s ``Py_GIL_DISABLED``) in fresh interpreters. Also
``python -m torch_aot_rt``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import _differential as D
import _fresh_python as fresh_python
from torch_aot_rt import _versions

from _root import ROOT  # noqa: E402
HERE = sys.version_info[:2]


def test_resolve_by_interpreter():
    """Every verified pair opens the gate; any other minor version, or a
    build other than the default, closes it, saying why; the opt-in opens an
    unverified minor version of a default build, never another build."""
    for release in _versions.VERIFIED:
        version = "%d.%d.0" % release.series
        for python in release.pythons:
            gate = _versions.resolve(version, python, "default")
            assert gate.verified and gate.reason is None and gate.release is release
        for python in ((3, 9), (3, 16)) + (((3, 10),) if (3, 10) not in release.pythons else ()):
            gate = _versions.resolve(version, python, "default")
            assert gate.release is None and gate.reason == (
                f"Python {_versions.python_name(python)} is not verified with torch "
                f"{release.name} (verified: "
                + ", ".join(_versions.python_name(p) for p in release.pythons) + ")")
        for kind in ("free-threaded", "debug", "pypy"):
            gate = _versions.resolve(version, release.pythons[0], kind)
            assert gate.release is None and not gate.loads_extension
            assert "is not supported (the C extension is not loaded there)" in gate.reason


def test_opt_in_opens_an_unverified_python_not_another_build(monkeypatch):
    monkeypatch.setenv(_versions.UNVERIFIED_ENV, "1")
    gate = _versions.resolve("2.15.0", (3, 16), "default")
    assert gate.unverified_opt_in and not gate.verified and gate.release.name == "2.15"
    gate = _versions.resolve("2.15.0", (3, 13), "free-threaded")
    assert gate.release is None and gate.reason.startswith("a free-threaded build of Python")


def test_build_kind_of_this_interpreter():
    assert _versions.build_kind() == "default"


# the import with TORCH_AOT_RT=0 changes nothing: the fake goes in before
# enable() decides the gate, as the import would
_IMPORT = """
import json, os, sys, warnings
import torch, torch._dynamo
os.environ["TORCH_AOT_RT"] = "0"
import torch_aot_rt
import torch_aot_rt._versions as versions
del os.environ["TORCH_AOT_RT"]
{fake}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch_aot_rt.enable()
    stats = torch_aot_rt.stats()
compiled = torch.compile(lambda x: x.sin() + 1, backend="aot_eager")
for _ in range(3):
    x = torch.ones(3, requires_grad=True)
    value = compiled(x).sum()
    value.backward()
print(json.dumps(dict(
    loaded="torch_aot_rt._C" in sys.modules,
    warnings=[(w.category.__name__, str(w.message)) for w in caught if "torch_aot_rt" in str(w.message)],
    inactive=stats["torch"]["inactive"], python=stats["python"],
    c_stats=torch_aot_rt.stats()["dynamo_compile_wrapper"], value=value.item(),
    grad=x.grad.tolist(),
    fn_type=type(compiled).__name__)))
"""


def _fresh(fake: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_AOT_RT", "TORCH_AOT_RT_UNVERIFIED")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = fresh_python.run(_IMPORT.format(fake=fake), env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _expected_values() -> tuple[float, list]:
    x = torch.ones(3, requires_grad=True)
    value = (x.sin() + 1).sum()
    value.backward()
    return value.item(), x.grad.tolist()


@pytest.mark.canary
@pytest.mark.cpp_independent  # the gate
def test_free_threaded_build_loads_no_extension():
    """On a free-threaded CPython (faked: build_kind says so before the
    import) the import loads no extension, warns once, replaces nothing,
    and the program's results are upstream's."""
    out = _fresh("versions.build_kind = lambda: 'free-threaded'")
    assert out["loaded"] is False, out
    assert [c for c, _ in out["warnings"]] == ["InactiveWarning"], out
    assert "a free-threaded build of Python" in out["warnings"][0][1], out
    assert "a free-threaded build of Python" in out["inactive"], out
    assert out["python"]["build"] == "free-threaded" and out["c_stats"] == {}, out
    assert (out["value"], out["grad"]) == _expected_values()


@pytest.mark.needs_c
@pytest.mark.cpp_independent  # the gate
def test_unverified_python_is_inactive():
    """A CPython minor version the running torch's release is not verified
    on (faked: the entry's pythons without this one): inactive, one warning
    naming the versions it is verified on, upstream's results."""
    fake = ("import dataclasses\n"
            "versions.VERIFIED = tuple(dataclasses.replace(r, pythons=tuple("
            f"p for p in r.pythons if p != {HERE!r})) for r in versions.VERIFIED)")
    out = _fresh(fake)
    assert [c for c, _ in out["warnings"]] == ["InactiveWarning"], out
    assert f"Python {_versions.python_name(HERE)} is not verified with torch" in out["inactive"]
    assert out["c_stats"] == {} and out["loaded"] is False, out
    assert (out["value"], out["grad"]) == _expected_values()


@pytest.mark.needs_c
@pytest.mark.cpp_independent  # the gate
def test_verified_pair_engages():
    out = _fresh("")
    assert out["warnings"] == [] and out["inactive"] is None and out["loaded"], out
    assert out["c_stats"]["calls in C"] >= 1 and out["fn_type"] == "function", out
    assert (out["value"], out["grad"]) == _expected_values()


_SETUP = """
import json, runpy, sys, sysconfig
import setuptools
kwargs = {{}}
setuptools.setup = lambda **kw: kwargs.update(kw)
{fake}
sys.argv = ["setup.py", "--name"]
runpy.run_path("setup.py", run_name="__main__")
print(json.dumps([(e.name, bool(getattr(e, "optional", False))) for e in kwargs["ext_modules"]]))
"""


def _setup_extensions(fake: str) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_AOT_RT")}
    env["TORCH_AOT_RT_CPP"] = "0"
    proc = subprocess.run([sys.executable, "-c", _SETUP.format(fake=fake)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.canary
@pytest.mark.cpp_independent  # the build
def test_setup_builds_no_extension_on_a_free_threaded_build():
    fake = ("get = sysconfig.get_config_var\n"
            "sysconfig.get_config_var = lambda k: 1 if k == 'Py_GIL_DISABLED' else get(k)")
    extensions, stderr = _setup_extensions(fake)
    assert extensions == [] and "a free-threaded build of Python: no extension is built" in stderr


@pytest.mark.canary
@pytest.mark.cpp_independent  # the build
def test_setup_c_core_optional_only_on_an_unverified_python():
    extensions, _ = _setup_extensions("")
    assert extensions == [["torch_aot_rt._C", False]]
    fake = "sys.version_info = (3, 16, 0, 'final', 0)"
    extensions, _ = _setup_extensions(fake)
    assert extensions == [["torch_aot_rt._C", True]]


@pytest.mark.needs_c
@pytest.mark.cpp_independent  # the gate and the self-check
def test_python_m_torch_aot_rt():
    """``python -m torch_aot_rt``: the versions, the gate's decision, the C++
    part's record, the self-check's verdict; exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_AOT_RT"}
    proc = subprocess.run([sys.executable, "-m", "torch_aot_rt"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())
    assert lines["Python"].startswith("%d.%d.%d (default build" % sys.version_info[:3])
    assert lines["torch"] == str(torch.__version__)
    assert lines["gate"].startswith(f"active: torch {D.RELEASE.name}'s semantics")
    assert lines["self-check"] == ("same results, C path off and on; 3 of 3 calls of the "
                                   "compiled function in C; fallbacks: none")
    assert "C++ part" in proc.stdout
