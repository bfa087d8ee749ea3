"""Building the package: the optional C++ part never fails an install.

Two wheel builds (``pip wheel --no-build-isolation --no-deps``, a few seconds
each: neither compiles the whole C++ part), each from its own copy of this
checkout's sources in its own tmp dir, so that they can run in parallel
(pytest-xdist) and leave the checkout's build/ and build records alone:

* a forced compile failure (TORCH_AOT_RT_CPP_BREAK=1, with
  TORCH_AOT_RT_CPP_FORCE=1 so the compile is tried on any series): the wheel
  builds, with the C core and a record that says why the C++ part is not there;
* a torch series whose headers the C++ part does not support: the running
  torch when it is one, else faked with TORCH_AOT_RT_CPP_SERIES_OVERRIDE.

Both plant a module "left by an earlier build" in the copy, which must not
reach the wheel. Then the loader (_cpp.load, _cpp.absence_reason) over records
in a tmp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from types import SimpleNamespace

import pytest
import torch

from torch_aot_rt import _cpp

# Runs on the canaries too: there the unsupported-headers case is the real one.
pytestmark = [pytest.mark.canary, pytest.mark.cpp_independent]

from _root import ROOT  # noqa: E402
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
NAME = _cpp.module_name(str(torch.__version__))
RECORD = _cpp.record_name(str(torch.__version__))
SERIES = _cpp.torch_series(str(torch.__version__))


def _parallel(group):
    """Each wheel build in an xdist group of its own (``--dist loadgroup``);
    with plain ``-n`` they spread anyway. The mark exists only with xdist."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return lambda f: f
    return pytest.mark.xdist_group(group)


def _copy_sources(dest):
    """What the build reads, without build outputs of the checkout."""
    for f in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(os.path.join(ROOT, f), dest)
    shutil.copytree(
        os.path.join(ROOT, "csrc"), os.path.join(dest, "csrc"),
        ignore=shutil.ignore_patterns("*.o", "*.so"),
    )
    os.mkdir(os.path.join(dest, "torch_aot_rt"))
    for f in os.listdir(os.path.join(ROOT, "torch_aot_rt")):
        if f.endswith(".py"):
            shutil.copy2(os.path.join(ROOT, "torch_aot_rt", f), os.path.join(dest, "torch_aot_rt"))


def _plant_stale_module(src):
    """A C++ part 'from an earlier build', in the source tree and in the
    build tree (with a record that vouched for it), newer than the sources."""
    build_lib = os.path.join(
        src, "build", f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    )
    planted = []
    for folder in (os.path.join(src, "torch_aot_rt"), os.path.join(build_lib, "torch_aot_rt")):
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, NAME + EXT_SUFFIX)
        with open(path, "wb") as f:
            f.write(b"not a module: left by an earlier build")
        planted.append(path)
    with open(os.path.join(build_lib, "torch_aot_rt", RECORD), "w") as f:
        json.dump({"module": NAME, "built": True, "reason": None, **_cpp.torch_identity(torch)}, f)
    # a C++ part for another torch, left in build/ by a build for that torch
    other = os.path.join(build_lib, "torch_aot_rt", "_torch_cpp_0_0_0_other")
    for suffix in (EXT_SUFFIX, ".json"):
        with open(other + suffix, "w") as f:
            f.write("{}")
    return build_lib


def _build_wheel(tmp_path, **env):
    src = tmp_path / "src"
    src.mkdir()
    _copy_sources(src)
    build_lib = _plant_stale_module(str(src))
    out = tmp_path / "wheel"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_AOT_RT_CPP")}
    environ.update(env)
    proc = subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
            "--no-index", "--no-cache-dir", "-w", str(out), str(src),
        ],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    (wheel,) = out.glob("torch_aot_rt-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        record = json.loads(z.read(f"torch_aot_rt/{RECORD}"))
    # the build really went through the build tree the stale module was planted in
    assert any(f.startswith("_C.") for f in os.listdir(os.path.join(build_lib, "torch_aot_rt")))
    return names, record, proc.stdout


def _assert_c_core_only(names, record, log, tmp_path):
    assert any(n.startswith("torch_aot_rt/_C.") and n.endswith(".so") for n in names), names
    assert not [n for n in names if n.startswith("torch_aot_rt/_torch_cpp_") and n.endswith(".so")]
    # only this torch's record: nothing another build left in build/
    assert [n for n in names if n.startswith("torch_aot_rt/_torch_cpp_")] == [
        f"torch_aot_rt/{RECORD}"
    ]
    assert record["built"] is False
    assert record["module"] == NAME
    for key, value in _cpp.torch_identity(torch).items():
        assert record[key] == value, key
    warning = (
        f"WARNING: torch_aot_rt: the optional C++ part (torch_aot_rt.{NAME}) is not built: "
        f"{record['reason']}; the C core is built and works without it"
    )
    assert warning in log, log[-6000:]
    # and the running torch's loader reads it as such
    records = tmp_path / "records"
    records.mkdir()
    (records / RECORD).write_text(json.dumps(record))
    (records / f"{NAME}{EXT_SUFFIX}").write_text("stale")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cpp, "_DIR", str(records))
        mp.delenv(_cpp.CPP_ENV, raising=False)
        assert _cpp.absence_reason(torch) == "not built: " + record["reason"]
        assert _cpp.load(torch) == (None, None, "not built: " + record["reason"])


@_parallel("wheel_compile_failure")
def test_wheel_builds_when_the_cpp_compile_fails(tmp_path):
    names, record, log = _build_wheel(
        tmp_path, TORCH_AOT_RT_CPP_BREAK="1", TORCH_AOT_RT_CPP_FORCE="1"
    )
    _assert_c_core_only(names, record, log, tmp_path)
    reason = record["reason"]
    # gcc: "<command-line>: fatal error: /nonexistent/rt_break.h: No such file or directory"
    assert reason.startswith(f"compiling the C++ part against torch {torch.__version__} failed: ")
    assert "error" in reason and "/nonexistent/rt_break.h" in reason, reason
    assert record.get("forced", False) is (SERIES not in _cpp.CPP_SERIES)


@_parallel("wheel_unsupported_series")
def test_wheel_on_unsupported_torch_series(tmp_path):
    if SERIES in _cpp.CPP_SERIES:
        # the same path in setup.py, with the decision taken for 2.10
        names, record, log = _build_wheel(tmp_path, TORCH_AOT_RT_CPP_SERIES_OVERRIDE="2.10")
        expected = (
            "torch 2.10's headers are not supported by the C++ part (it builds against torch "
            "2.11, 2.12, 2.13, 2.14, 2.15) [TORCH_AOT_RT_CPP_SERIES_OVERRIDE=2.10]"
        )
    else:
        names, record, log = _build_wheel(tmp_path)
        expected = _cpp.headers_unsupported(SERIES)
        assert expected.startswith("torch %d.%d's headers are not supported" % SERIES)
    _assert_c_core_only(names, record, log, tmp_path)
    assert record["reason"] == expected
    assert "forced" not in record


# -- the loader over build records ------------------------------------------

FAKE_VERSION = "9.9.0+fake"
FAKE_NAME = _cpp.module_name(FAKE_VERSION)
FAKE_RECORD = _cpp.record_name(FAKE_VERSION)


def fake_torch(version=FAKE_VERSION, git="abc123", abi=True):
    return SimpleNamespace(
        __version__=version,
        version=SimpleNamespace(git_version=git),
        _C=SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=abi),
    )


@pytest.fixture
def records(tmp_path, monkeypatch):
    """_cpp reading records from tmp_path, importing nothing real: imports
    are recorded and answered with a fake module."""
    monkeypatch.setattr(_cpp, "_DIR", str(tmp_path))
    monkeypatch.delenv(_cpp.CPP_ENV, raising=False)
    imported = []

    def import_module(name):
        imported.append(name)
        return SimpleNamespace(api="capsule")

    monkeypatch.setattr(_cpp, "importlib", SimpleNamespace(import_module=import_module))
    # a module "left by an earlier build" sits there in every case
    (tmp_path / f"{FAKE_NAME}{EXT_SUFFIX}").write_text("stale")

    def write(content=None, **fields):
        path = tmp_path / f"{FAKE_RECORD}"
        if content is None:
            record = {"module": FAKE_NAME, **_cpp.torch_identity(fake_torch())}
            record.update(fields)
            content = json.dumps(record)
        path.write_text(content)
        return path

    return SimpleNamespace(write=write, imported=imported, dir=tmp_path)


def check(expected_reason, imported, torch_=None):
    t = torch_ or fake_torch()
    assert _cpp.absence_reason(t) == expected_reason
    if expected_reason is None:
        assert _cpp.load(t) == ("capsule", FAKE_NAME, None)
        assert imported == [f"torch_aot_rt.{FAKE_NAME}"]
    else:
        assert _cpp.load(t) == (None, None, expected_reason)
        assert imported == []


def test_record_built(records):
    records.write(built=True, reason=None)
    check(None, records.imported)


def test_record_built_but_module_does_not_load(records, monkeypatch):
    records.write(built=True, reason=None)
    monkeypatch.setattr(_cpp, "importlib", __import__("importlib"))
    assert _cpp.absence_reason(fake_torch()) is None
    capsule, name, reason = _cpp.load(fake_torch())
    assert (capsule, name) == (None, None)
    assert reason.startswith(f"{FAKE_NAME} does not load: "), reason


@pytest.mark.parametrize(
    "reason",
    [
        "torch 2.10's headers are not supported by the C++ part (it builds against torch "
        "2.11, 2.12, 2.13, 2.14, 2.15)",
        "compiling the C++ part against torch 9.9.0+fake failed: x.cpp:1:2: error: nope",
        "TORCH_AOT_RT_CPP=0 at build",
    ],
)
def test_record_not_built(records, reason):
    """The stale module next to it is never imported."""
    records.write(built=False, reason=reason)
    check("not built: " + reason, records.imported)


def test_record_not_built_without_reason(records):
    records.write(built=False)
    check("not built: no reason recorded", records.imported)


def test_record_missing(records):
    check(f"not built for torch {FAKE_VERSION} (no {FAKE_RECORD})", records.imported)


@pytest.mark.parametrize(
    "content, detail",
    [("{not json", None), ("[1, 2]", "not a JSON object"), ("", None)],
)
def test_record_unreadable(records, content, detail):
    records.write(content)
    reason = _cpp.absence_reason(fake_torch())
    assert reason.startswith(f"unreadable build record {FAKE_RECORD}: "), reason
    if detail:
        assert reason.endswith(detail)
    check(reason, records.imported)


def test_record_unreadable_directory(records):
    (records.dir / f"{FAKE_RECORD}").mkdir()
    reason = _cpp.absence_reason(fake_torch())
    assert reason.startswith(f"unreadable build record {FAKE_RECORD}: "), reason
    check(reason, records.imported)


def test_record_without_built_field(records):
    """Written by the setup.py before the field, ahead of its compile."""
    records.write()
    check(
        f"build record {FAKE_RECORD} does not say whether it was built "
        "(written by an older setup.py: rebuild)",
        records.imported,
    )


@pytest.mark.parametrize(
    "running, expected",
    [
        (fake_torch(git="def456"), "built against another torch (git_version 'abc123', running 'def456')"),
        (fake_torch(abi=False), "built against another torch (cxx11_abi True, running False)"),
    ],
)
def test_record_of_another_torch(records, running, expected):
    records.write(built=True, reason=None)
    check(expected, records.imported, running)


def test_record_other_torch_version(records):
    """Same module name, another version string in the record."""
    records.write(built=True, reason=None, torch_version="9.9.0-fake")
    check(
        f"built against another torch (torch_version '9.9.0-fake', running '{FAKE_VERSION}')",
        records.imported,
    )


def test_switched_off_at_runtime(records, monkeypatch):
    records.write(built=True, reason=None)
    monkeypatch.setenv(_cpp.CPP_ENV, "0")
    check("switched off (TORCH_AOT_RT_CPP=0)", records.imported)


def test_cpp_series(monkeypatch):
    assert _cpp.CPP_SERIES == ((2, 11), (2, 12), (2, 13), (2, 14), (2, 15))
    for version, series in [("2.13.0+cpu", (2, 13)), ("2.14.1+cu130", (2, 14)),
                            ("2.15.0", (2, 15)), ("2.10.0+cu128", (2, 10)), ("junk", None)]:
        assert _cpp.torch_series(version) == series
    for series in _cpp.CPP_SERIES:
        assert _cpp.headers_unsupported(series) is None
    for minor in (10, 16):
        assert _cpp.headers_unsupported((2, minor)) == (
            f"torch 2.{minor}'s headers are not supported by the C++ part (it builds against "
            "torch 2.11, 2.12, 2.13, 2.14, 2.15)"
        )
    # a series it compiles against but whose node is untested (2.11 was, until
    # its CompiledFunction ran in C): none now; the reason, as setup.py says it
    assert _cpp.NODE_UNTESTED == ()
    monkeypatch.setattr(_cpp, "NODE_UNTESTED", ((2, 10),))
    assert _cpp.headers_unsupported((2, 10)) == (
        "torch 2.10's headers are not supported by the C++ part yet (it compiles against "
        "them, as against 2.12's, but its autograd node is untested there: no "
        "CompiledFunction of that release runs in C yet; it builds against torch 2.11, 2.12, "
        "2.13, 2.14, 2.15)"
    )
    assert _cpp.headers_unsupported(None).startswith("a torch of unknown series is not supported")


def test_cpp_part_is_one_unit_of_every_file():
    """setup.py compiles csrc/cpp/unity.cpp, which includes every other .cpp
    of the folder exactly once (a file left out would be dead code, or a
    link error far from its cause)."""
    import re

    folder = os.path.join(ROOT, "csrc", "cpp")
    with open(os.path.join(folder, "unity.cpp")) as f:
        included = re.findall(r'^#include "([^"]+)"', f.read(), re.MULTILINE)
    files = sorted(n for n in os.listdir(folder) if n.endswith(".cpp") and n != "unity.cpp")
    assert sorted(included) == files and len(set(included)) == len(included), included


def test_node_ownership_spelled_in_one_place():
    """Who owns a torch::autograd::Node (c10::intrusive_ptr from torch 2.13,
    std::shared_ptr on 2.11/2.12) is written in csrc/cpp/node_ptr.h only;
    the rest of the C++ part goes through NodePtr / WeakNodePtr / make_node /
    face_owns_node (comments aside)."""
    import re

    folder = os.path.join(ROOT, "csrc", "cpp")
    spelled = re.compile(
        r"intrusive_ptr|make_intrusive|enable_shared_from_this|use_count\s*\("
        r"|(?:shared|weak)_ptr\s*<\s*(?:torch::autograd::)?(?:Node|CompiledFunctionNode)\b"
    )
    found = []
    for name in sorted(os.listdir(folder)):
        if name == "node_ptr.h" or not name.endswith((".cpp", ".h")):
            continue
        with open(os.path.join(folder, name)) as f:
            for i, line in enumerate(f, 1):
                code = line.split("//", 1)[0]
                if spelled.search(code):
                    found.append(f"{name}:{i}: {line.strip()}")
    assert found == []
    with open(os.path.join(folder, "node_ptr.h")) as f:
        header = f.read()
    assert "c10::intrusive_ptr<T>" in header and "std::shared_ptr<T>" in header
