"""The README's support matrix is the gate's table: made by
``torch_aot_rt._versions.support_matrix()``, so it cannot drift from what the
gate verifies."""

from __future__ import annotations

import os

from torch_aot_rt import _versions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = "<!-- made by torch_aot_rt._versions.support_matrix(); tests/test_docs.py checks it -->"
END = "<!-- end of the support matrix -->"


def test_readme_support_matrix_is_the_gates():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert START in text and END in text
    shown = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert shown == _versions.support_matrix()
