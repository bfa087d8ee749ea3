"""The README's support matrix is the gate's table: made by
``torch_aot_rt._versions.support_matrix()``, so it cannot drift from what the
gate verifies."""

from __future__ import annotations

import os

from torch_aot_rt import _versions

from _root import ROOT  # noqa: E402
START = "<!-- made by torch_aot_rt._versions.support_matrix(); tests/gate/test_docs.py checks it -->"
END = "<!-- end of the support matrix -->"


def test_readme_support_matrix_is_the_gates():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert START in text and END in text
    shown = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert shown == _versions.support_matrix()


def test_c_stub_names_what_the_module_has():
    """torch_aot_rt/_C.pyi names every public attribute of the C core, and
    nothing else (its private helper class aside)."""
    import ast

    import pytest

    _C = pytest.importorskip("torch_aot_rt._C")
    with open(os.path.join(ROOT, "torch_aot_rt", "_C.pyi")) as f:
        tree = ast.parse(f.read())
    stubbed = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            stubbed.add(node.target.id)
    actual = {n for n in dir(_C) if not n.startswith("__")}
    assert stubbed - {"_CFunction"} == actual
