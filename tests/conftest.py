"""Shared fixtures for the torch_aot_rt test suite.

The suite is differential: every case is compiled and run once with the C
runtime off (upstream's ``_create_runtime_wrapper``) and once with it on, in
the same process, and everything observable is compared (see
``tests/_differential.py``).

Modes, chosen by the environment as for the package itself:

* default: ``import torch_aot_rt`` enables the C path; the extension must be
  built (``pip install --no-build-isolation -e .``). Every "on" run asserts that
  C wrappers were really built and that nothing fell back unexpectedly.
* ``TORCH_AOT_RT=0``: the import changes nothing; the differential tests then
  compare upstream with upstream (a check of the harness itself) and the tests
  that need the extension are skipped.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# Keep the inductor / AOTAutograd on-disk caches of this run to itself, so that
# cache hits and misses depend only on what this session compiled.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torch_aot_rt_tests_")
)

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

try:
    import torch_aot_rt  # noqa: E402,F401
except ImportError as e:  # pragma: no cover - a broken build
    raise pytest.UsageError(
        f"cannot import torch_aot_rt ({e}); build the extension with "
        "`pip install --no-build-isolation -e .` or run with TORCH_AOT_RT=0"
    ) from e

import _differential as D  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# The CUDA CI job (.github/workflows/ci.yml) sets this: a runner whose torch
# cannot see a GPU must fail, not pass with the CPU cases alone.
if os.environ.get("TORCH_AOT_RT_REQUIRE_CUDA", "") == "1" and "cuda" not in DEVICES:
    raise pytest.UsageError(
        "TORCH_AOT_RT_REQUIRE_CUDA=1, but torch.cuda.is_available() is False "
        f"(torch {torch.__version__})"
    )


# scripts/test.sh's canary lanes: a torch no release entry covers, where the
# import must change nothing; a canary on which the C path is active is a
# misconfigured run, not a pass.
CANARY = os.environ.get("TORCH_AOT_RT_CANARY", "") == "1"
if CANARY and D.IMPORT_ENABLED and D.INACTIVE is None:
    raise pytest.UsageError(
        f"TORCH_AOT_RT_CANARY=1, but torch_aot_rt is active on torch {torch.__version__}"
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "inductor: compiles with backend='inductor' (slow; deselect with -m 'not inductor')"
    )
    config.addinivalue_line(
        "markers", "needs_c: needs the C extension (skipped when TORCH_AOT_RT=0)"
    )
    config.addinivalue_line(
        "markers",
        "canary: runs on every torch, also where the import is inactive (an unverified "
        "release): there it checks that torch is left exactly as it was",
    )
    config.addinivalue_line(
        "markers",
        "cpp_independent: checks what does not depend on the C++ part (the gate, the "
        "build, the loader and the switches, each in its own subprocess that sets "
        "TORCH_AOT_RT_CPP itself or reads nothing of it): scripts/test.sh runs it in a "
        "release's run with the C++ part and deselects it in the same release's "
        "C-core-alone run (TORCH_AOT_RT_ONCE_PER_RELEASE=1)",
    )


def pytest_report_header(config):
    if D.C_ENABLED:
        mode = "C runtime on (differential: upstream vs C)"
    elif D.INACTIVE is not None:
        mode = (f"inactive on this torch ({D.INACTIVE}): differential upstream vs upstream "
                "with the package imported; only the canary tests run")
    else:
        mode = "TORCH_AOT_RT=0 (differential: upstream vs upstream, C-only tests skipped)"
    return [f"torch {torch.__version__}; torch_aot_rt: {mode}; devices: {DEVICES}"]


# scripts/test.sh sets this in the C-core-alone run of a release that also has a
# run with the C++ part: what is the same in both runs (marked cpp_independent)
# runs once, in the other.
ONCE_PER_RELEASE = (os.environ.get("TORCH_AOT_RT_ONCE_PER_RELEASE", "") == "1"
                    and os.environ.get("TORCH_AOT_RT_CPP", "") == "0")


def pytest_collection_modifyitems(config, items):
    if ONCE_PER_RELEASE:
        kept = [item for item in items if "cpp_independent" not in item.keywords]
        if len(kept) < len(items):
            config.hook.pytest_deselected(
                items=[item for item in items if "cpp_independent" in item.keywords])
            items[:] = kept
    if D.C_ENABLED:
        return
    if D.INACTIVE is not None:
        skip = pytest.mark.skip(
            reason=f"needs a verified torch release: torch_aot_rt is inactive on torch "
            f"{torch.__version__} ({D.INACTIVE})"
        )
        for item in items:
            if "canary" not in item.keywords:
                item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="needs the C extension; TORCH_AOT_RT=0")
    for item in items:
        if "needs_c" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _clean_state():
    """Each test starts from a fresh Dynamo and leaves the thread state as found."""
    torch._dynamo.reset()
    before = D.tls_state()
    yield
    D.restore_tls(before)
    torch._dynamo.reset()
