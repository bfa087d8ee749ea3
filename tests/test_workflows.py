"""The CI workflows (.github/workflows/) test the way `.ci/run` does.

They cannot run here; scripts/lint_workflows.sh lints them (schema and
zizmor). This pins, in the suite, that there is one way to test: every job's
test step runs `bash .ci/run`, with the torch release it names, and the CUDA
job requires CUDA.
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


def test_every_job_runs_ci_run():
    with open(WORKFLOW) as f:
        text = f.read()
    jobs = _jobs(text)
    assert set(jobs) == {"cpu", "cuda"}, sorted(jobs)
    for name, job in jobs.items():
        runs = re.findall(r"^\s+run: (.+)$", job, flags=re.M)
        assert "bash .ci/run" in runs, (name, runs)
        assert "TORCH_AOT_RT_TORCH: ${{ matrix.torch }}" in job, name
        releases = re.search(r'torch: \[(.*)\]', job).group(1)
        assert [r.strip(' "') for r in releases.split(",")] == ["2.13.0", "2.14.1"], name
    assert 'TORCH_AOT_RT_REQUIRE_CUDA: "1"' in jobs["cuda"]
    assert re.search(r'python: \["3.10", "3.11", "3.12"\]', jobs["cpu"])


def test_releases_match_setup_env():
    """The workflow's releases are the ones scripts/setup_env.sh tests."""
    with open(os.path.join(ROOT, "scripts", "setup_env.sh")) as f:
        m = re.search(r"^TORCH_RELEASES=\((.*)\)$", f.read(), flags=re.M)
    assert m.group(1).split() == ["2.13.0", "2.14.1"]
