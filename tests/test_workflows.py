"""The CI workflows (.github/workflows/) test the way `.ci/run` does.

They cannot run here; scripts/lint_workflows.sh lints them (schema and
zizmor). This pins, in the suite, that there is one way to test: every job's
test step runs `bash .ci/run`, with the torch release it names, and the CUDA
job requires CUDA; and that the jobs cover scripts/setup_env.sh's releases:
the CPU job its TORCH_RELEASES and CANARY_RELEASES, the CUDA job its
TORCH_RELEASES.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOW = os.path.join(ROOT, ".github", "workflows", "ci.yml")


def _jobs(text: str) -> dict[str, str]:
    """Job name -> its text (the two-space-indented keys under `jobs:`)."""
    body = text.split("\njobs:\n", 1)[1]
    parts = re.split(r"^  ([A-Za-z0-9_-]+):\n", body, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _workflow_jobs() -> dict[str, str]:
    with open(WORKFLOW) as f:
        return _jobs(f.read())


def _matrix_torch(job: str) -> list[str]:
    """The job's `torch: [...]` matrix entry."""
    m = re.search(r"^\s+torch: \[(.*)\]$", job, flags=re.M)
    assert m is not None, job
    return [r.strip(' "') for r in m.group(1).split(",")]


def _setup_env_list(name: str) -> list[str]:
    """A bash array of scripts/setup_env.sh: NAME=(a b c)."""
    with open(os.path.join(ROOT, "scripts", "setup_env.sh")) as f:
        m = re.search(rf"^{name}=\((.*)\)$", f.read(), flags=re.M)
    assert m is not None, name
    return m.group(1).split()


def test_every_job_runs_ci_run():
    jobs = _workflow_jobs()
    assert set(jobs) == {"cpu", "cuda"}, sorted(jobs)
    for name, job in jobs.items():
        runs = re.findall(r"^\s+run: (.+)$", job, flags=re.M)
        assert "bash .ci/run" in runs, (name, runs)
        assert "TORCH_AOT_RT_TORCH: ${{ matrix.torch }}" in job, name
    assert 'TORCH_AOT_RT_REQUIRE_CUDA: "1"' in jobs["cuda"]
    assert re.search(r'python: \["3.10", "3.11", "3.12"\]', jobs["cpu"])


def test_releases_match_setup_env():
    """The workflow's releases are the ones scripts/setup_env.sh tests: the CPU
    job runs every release and every canary, the CUDA job every release."""
    releases = _setup_env_list("TORCH_RELEASES")
    canaries = _setup_env_list("CANARY_RELEASES")
    assert releases and canaries
    assert not set(releases) & set(canaries), (releases, canaries)
    jobs = _workflow_jobs()
    assert _matrix_torch(jobs["cpu"]) == releases + canaries
    assert _matrix_torch(jobs["cuda"]) == releases


def test_cpp_releases_match_cpp_series():
    """scripts/setup_env.sh's CPP_RELEASES (the releases the suite runs with
    and without the C++ part) are the verified releases whose series
    torch_aot_rt/_cpp.py builds the C++ part for."""
    from torch_aot_rt import _cpp

    releases = _setup_env_list("TORCH_RELEASES")
    cpp = _setup_env_list("CPP_RELEASES")
    series = {r: tuple(int(x) for x in r.split(".")[:2]) for r in releases}
    assert cpp == [r for r in releases if series[r] in _cpp.CPP_SERIES], (cpp, releases)
