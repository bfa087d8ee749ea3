"""The CI workflows (.github/workflows/) test the way `.ci/run` does.

They cannot run here; scripts/lint_workflows.sh lints them (schema and
zizmor). This pins, in the suite, that there is one way to test: every job's
test step runs `bash .ci/run`, with the torch release and CPython it names,
and the CUDA job requires CUDA; that the jobs cover scripts/setup_env.sh's
ENVIRONMENTS (the CPU job each of them, the CUDA job each torch release on
CPython 3.11); and that ENVIRONMENTS covers what the gate verifies
(torch_aot_rt/_versions.py): each CPython with the newest torch release it
is verified with, each torch release with CPython 3.11, nothing else but
canaries, which no entry verifies.
"""

from __future__ import annotations

import os
import re

from _root import ROOT  # noqa: E402
WORKFLOW = os.path.join(ROOT, ".github", "workflows", "ci.yml")


def _jobs(text: str) -> dict[str, str]:
    """Job name -> its text (the two-space-indented keys under `jobs:`)."""
    body = text.split("\njobs:\n", 1)[1]
    parts = re.split(r"^  ([A-Za-z0-9_-]+):\n", body, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _workflow_jobs() -> dict[str, str]:
    with open(WORKFLOW) as f:
        return _jobs(f.read())


def _matrix(job: str, key: str) -> list[str]:
    """The job's `<key>: [...]` matrix entry."""
    m = re.search(rf"^\s+{key}: \[(.*)\]$", job, flags=re.M)
    assert m is not None, (key, job)
    return [r.strip(' "') for r in m.group(1).split(",")]


def environments() -> list[tuple[str, str, list[str]]]:
    """scripts/setup_env.sh's ENVIRONMENTS: (torch, CPython, configurations)."""
    with open(os.path.join(ROOT, "scripts", "setup_env.sh")) as f:
        m = re.search(r"^ENVIRONMENTS=\(\n(.*?)\n\)$", f.read(), flags=re.M | re.S)
    assert m is not None
    out = []
    for line in m.group(1).splitlines():
        torch, python, *configs = line.strip().strip('"').split()
        out.append((torch, python, configs))
    return out


def test_every_job_runs_ci_run():
    jobs = _workflow_jobs()
    assert set(jobs) == {"cpu", "cuda"}, sorted(jobs)
    for name, job in jobs.items():
        runs = re.findall(r"^\s+run: (.+)$", job, flags=re.M)
        assert "bash .ci/run" in runs, (name, runs)
        assert "TORCH_AOT_RT_TORCH: ${{ matrix.torch }}" in job, name
        assert "TORCH_AOT_RT_PYTHON: ${{ matrix.python }}" in job, name
    assert 'TORCH_AOT_RT_REQUIRE_CUDA: "1"' in jobs["cuda"]


def test_jobs_match_setup_env():
    """The CPU job runs each environment of scripts/setup_env.sh (its
    include list, in order), the CUDA job each torch release on CPython 3.11."""
    jobs = _workflow_jobs()
    cpu = re.findall(r'^\s+- \{torch: "([^"]+)", python: "([^"]+)"\}$', jobs["cpu"], flags=re.M)
    assert cpu == [(t, p) for t, p, _ in environments()]
    assert _matrix(jobs["cuda"], "torch") == [
        t for t, p, configs in environments() if p == "3.11" and "canary" not in configs]
    assert _matrix(jobs["cuda"], "python") == ["3.11"]


def test_environments_cover_the_verified_pairs():
    """Every (torch, CPython) pair an environment tests is one the gate
    verifies (a canary: a torch no entry covers); each CPython the gate
    verifies runs with the newest torch release verified on it, and each
    verified release runs on CPython 3.11, with the C++ part."""
    from torch_aot_rt import _versions

    def series(torch):
        return tuple(int(x) for x in torch.split(".")[:2])

    verified = {(r.series, p) for r in _versions.VERIFIED for p in r.pythons}
    envs = environments()
    for torch, python, configs in envs:
        pair = (series(torch), tuple(int(x) for x in python.split(".")))
        if "canary" in configs:
            assert configs == ["canary"] and all(r.series != pair[0] for r in _versions.VERIFIED)
        else:
            assert pair in verified and "cpp" in configs, (torch, python)
    tested = {(series(t), p, tuple(c)) for t, p, c in envs}
    for python in sorted({p for _, p in verified}):
        newest = max(s for s, p in verified if p == python)
        assert any(s == newest and p == _versions.python_name(python) and "cpp" in c
                   for s, p, c in tested), (newest, python)
    for release in _versions.VERIFIED:
        assert any(s == release.series and p == "3.11" and "cpp" in c
                   for s, p, c in tested), release.name


def test_cpp_releases_match_cpp_series():
    """Every verified environment runs with the C++ part: its torch series is
    one torch_aot_rt/_cpp.py builds the C++ part for."""
    from torch_aot_rt import _cpp

    for torch, python, configs in environments():
        if "canary" not in configs:
            assert tuple(int(x) for x in torch.split(".")[:2]) in _cpp.CPP_SERIES, torch
