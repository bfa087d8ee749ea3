"""Torch-version robustness: on a torch outside the verified list, or one whose
internals differ from its release entry, `import torch_aot_rt` still works,
replaces nothing (stats() says why) and every compile is upstream's;
TORCH_AOT_RT_UNVERIFIED=1 opts back in. Simulated in a subprocess by faking the
version string or removing an internal before the import (tests/gate/test_inactive.py
checks, attribute by attribute, that nothing is replaced)."""

import os
import sys
import textwrap

import pytest

from _gate_probe import CANDIDATE, INSTALLED, run
from _root import ROOT  # noqa: E402

# the gate, in subprocesses: the same with the C++ part and without
pytestmark = pytest.mark.cpp_independent


def _check_fallbacks(stats) -> None:
    """No fallback counted (nothing a compile did, nothing at install)."""
    assert stats["fallbacks"] == 0, stats


def test_baseline_uses_c_path():
    result = run("", **INSTALLED)
    assert result["same"]
    assert result["stats"]["runtime_wrappers"] == 1
    assert result["stats"]["autograd_functions"] == 1
    _check_fallbacks(result["stats"])


@pytest.mark.parametrize(
    "remove, reason",
    [
        (
            "del torch._C._autograd._saved_tensors_hooks_get_disabled_error_message",
            "_saved_tensors_hooks_get_disabled_error_message",
        ),
        ("del torch._C._functorch.unwrap_if_dead", "unwrap_if_dead"),
    ],
)
def test_missing_binding_falls_back_everywhere(remove, reason):
    result = run(remove, **INSTALLED)
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 0 and stats["autograd_functions"] == 0
    assert stats["fallbacks"] == 0, stats
    assert reason in stats["torch"]["inactive"], stats["torch"]


def test_changed_compiled_function_internals_keep_c_runtime_wrapper():
    # A torch whose CompiledFunction closes over other names than we read.
    result = run(
        "import torch_aot_rt._autograd_plan as ap; ap._closure = lambda fn: {}", **INSTALLED
    )
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 1 and stats["autograd_functions"] == 0
    (reason,) = [k for k in stats["fallback_reasons"] if "not mirrored" not in k]
    assert reason.startswith("CompiledFunction: torch internals differ"), reason


def test_missing_first_invocation_context_falls_back():
    # Every verified release has the first-call custom-op aliasing check.
    # missing when the package installs, put back for upstream (2.11's
    # _create_runtime_wrapper reads the global on every build)
    result = run(
        "first = rw._FirstInvocationContext; del rw._FirstInvocationContext; "
        "import torch_aot_rt; rw._FirstInvocationContext = first",
        **INSTALLED,
    )
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 0 and stats["autograd_functions"] == 0
    assert "_FirstInvocationContext" in stats["torch"]["inactive"], stats["torch"]


def test_release_entry_contradicted_falls_back():
    # A torch claiming a verified version whose Function.apply is not what
    # that release's entry says: not the source we verified.
    import torch
    from torch_aot_rt import _versions

    rel = _versions.resolve(str(torch.__version__)).release
    if rel is None:
        pytest.skip(f"torch {torch.__version__} is not a verified release")
    other = "2.13.0" if rel.function_apply_is_base else "2.14.1"
    fake = f"torch.__version__ = {other!r}"
    if sys.version_info[:2] not in _versions.resolve(other, (3, 11)).release.pythons:
        # a CPython that release is not verified on (3.15): the gate's table
        # says it is, so that what is checked is the entry, not the pair
        fake += textwrap.dedent(f"""
            import dataclasses, importlib.util, sys
            spec = importlib.util.spec_from_file_location(
                "torch_aot_rt._versions", {os.path.join(ROOT, "torch_aot_rt", "_versions.py")!r})
            versions = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = versions
            spec.loader.exec_module(versions)
            versions.VERIFIED = tuple(dataclasses.replace(r, pythons=(sys.version_info[:2],))
                                      for r in versions.VERIFIED)
            """)
    result = run(fake)
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 0 and stats["autograd_functions"] == 0
    # the other release's fingerprints do not match this torch's source
    assert "is not the verified" in stats["torch"]["inactive"], stats["torch"]


UNVERIFIED = ["2.10.0", "2.16.0", "2.15.0a0+git1234567", "3.0.0", "not-a-version"]


@pytest.mark.parametrize("version", UNVERIFIED)
def test_unverified_version_falls_back(version):
    result = run(f"torch.__version__ = {version!r}")
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 0 and stats["autograd_functions"] == 0
    assert stats["fallbacks"] == 0 and stats["fallback_reasons"] == {}, stats
    assert stats["torch"] == {
        "version": version, "release": None, "unverified_opt_in": False,
        "inactive": f"torch {version} is not a verified version",
    }


# Unverified versions the opt-in maps onto the installed release's entry (so
# the results are exact): the nearest entry not newer, or the oldest.
OPT_IN = {
    (2, 11): ["2.11.0a0+git1234567", "2.10.0"],
    (2, 12): ["2.12.0a0+git1234567", "2.12.2rc1"],
    (2, 13): ["2.13.0a0+git1234567", "2.13.1rc1"],
    (2, 14): ["2.14.0a0+git1234567", "2.14.2rc1"],
    (2, 15): ["2.16.0", "2.15.0a0+git1234567"],
}


@pytest.mark.parametrize("which", [0, 1])
def test_unverified_opt_in(which):
    import torch

    installed = _series(str(torch.__version__))
    assert installed in OPT_IN, f"add torch {installed}'s opt-in cases"
    version = OPT_IN[installed][which]
    result = run(f"torch.__version__ = {version!r}", TORCH_AOT_RT_UNVERIFIED="1")
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 1 and stats["autograd_functions"] == 1
    _check_fallbacks(stats)
    assert stats["torch"] == {
        "version": version,
        "release": "%d.%d" % installed,
        "unverified_opt_in": True,
        "inactive": None,
    }


def test_opt_in_checks_the_entrys_claims():
    """The opt-in on a pre-release of 2.11 uses 2.11's entry; a torch that
    contradicts it (here the installed one, whose backward is boxed and whose
    runtime wrapper is generated) stays inactive."""
    import torch

    if _series(str(torch.__version__)) < (2, 13):
        pytest.skip("torch 2.11/2.12 run the reference Python the 2.11 entry claims")
    result = run("torch.__version__ = '2.11.0a0+git1234567'", TORCH_AOT_RT_UNVERIFIED="1")
    stats = result["stats"]
    assert stats["torch"]["release"] is None or stats["torch"]["inactive"] is not None, stats
    assert "torch internals differ" in stats["torch"]["inactive"], stats
    # the first claim it contradicts: Function.apply (2.14 on), else apply_boxed
    assert "unlike torch 2.11" in stats["torch"]["inactive"], stats
    assert stats["runtime_wrappers"] == 0 and stats["autograd_functions"] == 0
    assert result["same"]


def test_verified_version_reports_release():
    import torch

    result = run("")
    if CANDIDATE:
        # not verified: inactive without the opt-in, its entry with it
        version = str(torch.__version__)
        assert result["stats"]["torch"]["inactive"] == f"torch {version} is not a verified version"
        opted = run("", **INSTALLED)
        assert opted["stats"]["torch"] == {
            "version": version, "release": "%d.%d" % _series(version),
            "unverified_opt_in": True, "inactive": None,
        }
        assert opted["stats"]["runtime_wrappers"] == 1
        return
    assert result["stats"]["torch"] == {
        "version": str(torch.__version__),
        "release": "%d.%d" % _series(str(torch.__version__)),
        "unverified_opt_in": False,
        "inactive": None,
    }
    # the opt-in changes nothing on a verified release
    opted = run("", TORCH_AOT_RT_UNVERIFIED="1")
    assert opted["stats"]["torch"]["unverified_opt_in"] is False
    assert opted["stats"]["runtime_wrappers"] == 1


def _series(version: str) -> tuple:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_resolve_table(monkeypatch):
    from torch_aot_rt import _versions

    monkeypatch.delenv("TORCH_AOT_RT_UNVERIFIED", raising=False)  # a candidate's run opts in

    names = [r.name for r in _versions.VERIFIED]
    assert names == ["2.11", "2.12", "2.13", "2.14", "2.15"]
    for v, want in [("2.11.0+cu130", "2.11"), ("2.11.0", "2.11"),
                    ("2.12.1+cu130", "2.12"), ("2.12.0", "2.12"),
                    ("2.13.0", "2.13"), ("2.13.5+cpu", "2.13"), ("2.14.1+cu130", "2.14"),
                    ("2.14.0", "2.14"), ("2.15.0", "2.15"), ("2.15.0+cu132", "2.15")]:
        gate = _versions.resolve(v, (3, 11))  # a CPython every release is verified on
        assert gate.verified and gate.release.name == want and gate.reason is None
    for v in UNVERIFIED + ["2.13", "2.13.0rc1", "2.14.1.post1"]:
        gate = _versions.resolve(v, (3, 11))
        assert not gate.verified and gate.release is None
        assert gate.reason == f"torch {v} is not a verified version"


def test_candidates(monkeypatch):
    """A candidate entry (read and mirrored, not verified; none now, 2.11 was
    one): inactive without the opt-in, its own entry (not the nearest
    verified one) with it."""
    import dataclasses

    from torch_aot_rt import _versions

    assert _versions.CANDIDATES == ()
    fake = dataclasses.replace(_versions.VERIFIED[0], series=(2, 10))
    monkeypatch.setattr(_versions, "CANDIDATES", (fake,))
    monkeypatch.delenv("TORCH_AOT_RT_UNVERIFIED", raising=False)
    gate = _versions.resolve("2.10.0")
    assert gate.release is None and gate.reason == "torch 2.10.0 is not a verified version"
    monkeypatch.setenv("TORCH_AOT_RT_UNVERIFIED", "1")
    for v in ("2.10.0", "2.10.1+cu128", "2.10.0a0+git1234567"):
        gate = _versions.resolve(v)
        assert gate.release is fake and not gate.verified and gate.unverified_opt_in, v
    # other series: the nearest verified entry, as without candidates
    assert _versions.resolve("2.9.0").release is _versions.VERIFIED[0]
    assert _versions.resolve("2.12.0a0").release.name == "2.12"
