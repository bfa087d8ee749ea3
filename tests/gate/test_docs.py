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


def test_architecture_map_names_every_source_file():
    """docs/architecture.md's map of the tree names every file of csrc/ and of
    the package (a stem shared by a .c and its .h, such as ``state.[ch]``, or
    files listed together, count once), so it cannot leave out what the code
    has."""
    import re

    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        text = f.read()
    block = text.split("```", 2)[1]  # the map: the document's first code block
    named = set(re.findall(r"[\w.]+\.(?:pyi|py|cpp|c|h|\[ch\])(?!\w)", block))
    stems = {n.rsplit(".", 1)[0] for n in named}
    missing = []
    for top, exts in (("csrc", (".c", ".h", ".cpp")), ("torch_aot_rt", (".py", ".pyi"))):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(exts):
                    continue
                if name not in named and name.rsplit(".", 1)[0] not in stems:
                    missing.append(os.path.relpath(os.path.join(folder, name), ROOT))
    assert not missing, missing
