"""The fingerprint gate (torch_aot_rt/_mirrored.py, _fingerprints.py) and the
release-diff script (scripts/release_diff.py): a change to any mirrored piece
of upstream code is seen, and named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from torch_aot_rt import _fingerprints, _mirrored, _versions

pytestmark = [pytest.mark.canary, pytest.mark.cpp_independent]

from _root import ROOT  # noqa: E402
TORCH_DIR = os.path.dirname(torch.__file__)
GAA = "_functorch/_aot_autograd/functional_utils.py"


def _copy_torch(tmp_path) -> str:
    """The mirrored files of the running torch, copied under tmp_path/torch."""
    out = tmp_path / "torch"
    for path, _ in _mirrored.MIRRORED:
        src = os.path.join(TORCH_DIR, path)
        if os.path.exists(src):
            dst = out / path
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    (out / "_functorch").mkdir(exist_ok=True)
    (out / "_functorch" / "__init__.py").touch()
    return str(out)


def _edit(torch_dir: str, path: str, old: str, new: str) -> None:
    full = os.path.join(torch_dir, path)
    with open(full) as f:
        text = f.read()
    assert old in text, (path, old)
    with open(full, "w") as f:
        f.write(text.replace(old, new, 1))


def test_every_release_has_fingerprints_of_exactly_the_mirrored_list():
    names = _mirrored.names()
    assert len(names) == len(set(names))
    for release in _versions.VERIFIED:
        table = _fingerprints.FINGERPRINTS[release.name]
        assert list(table) == names, release.name
        # the core of what we mirror exists on every verified release
        assert table[f"{_mirrored.MIRRORED[0][0]}:_create_runtime_wrapper"] is not None


def test_running_torch_matches_its_entry_or_is_not_verified():
    gate = _versions.resolve(torch.__version__)
    why = None
    if gate.verified:
        why = _mirrored.mismatch(_fingerprints.FINGERPRINTS[gate.release.name], TORCH_DIR)
    assert why is None, why


def test_a_copy_matches_and_an_edit_is_named(tmp_path):
    copy = _copy_torch(tmp_path)
    expected = _mirrored.fingerprints(TORCH_DIR)
    assert _mirrored.mismatch(expected, copy) is None
    # a change inside one function body (a comment counts: not the source we read)
    _edit(copy, GAA, "def gen_alias_from_base(", "def gen_alias_from_base(  # patched\n    ")
    assert _mirrored.mismatch(expected, copy) == (
        f"{GAA}:gen_alias_from_base differs from the verified source"
    )


def test_a_method_and_a_global_are_pieces(tmp_path):
    copy = _copy_torch(tmp_path)
    sources = _mirrored.sources(copy)
    method = sources["_dynamo/guards.py:GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS"]
    assert "\ndef AUTOGRAD_SAVED_TENSORS_HOOKS(self" in "\n" + method, method[:80]
    registry = sources["_dynamo/graph_bytecode_inputs.py:index_to_external_object_weakref"]
    assert registry is not None and registry.startswith("index_to_external_object_weakref")
    expected = _mirrored.fingerprints(copy)
    _edit(copy, "_dynamo/guards.py", "def AUTOGRAD_SAVED_TENSORS_HOOKS(self",
          "def AUTOGRAD_SAVED_TENSORS_HOOKS(  self")
    assert "GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS differs" in _mirrored.mismatch(expected, copy)


def test_a_removed_and_an_added_piece_are_named(tmp_path):
    copy = _copy_torch(tmp_path)
    expected = _mirrored.fingerprints(copy)
    _edit(copy, GAA, "def gen_alias_from_base(", "def gen_alias_from_base_renamed(")
    assert _mirrored.mismatch(expected, copy) == (
        f"{GAA}:gen_alias_from_base is missing (the verified release has it)"
    )
    absent = dict(expected, **{f"{GAA}:gen_alias_from_base": None})
    assert _mirrored.mismatch(absent, _copy_torch(tmp_path / "again")) == (
        f"{GAA}:gen_alias_from_base exists (the verified release has none)"
    )


def test_release_diff_script_prints_the_changed_function(tmp_path):
    copy = _copy_torch(tmp_path)
    _edit(copy, GAA, "def gen_alias_from_base(", "def gen_alias_from_base(  # patched\n    ")
    script = os.path.join(ROOT, "scripts", "release_diff.py")
    same = subprocess.run([sys.executable, script, "--summary", TORCH_DIR, TORCH_DIR],
                          capture_output=True, text=True)
    assert same.returncode == 0, same.stderr
    assert f"0 of {len(_mirrored.names())} mirrored pieces differ" in same.stdout
    diff = subprocess.run([sys.executable, script, TORCH_DIR, copy],
                          capture_output=True, text=True)
    assert diff.returncode == 1, diff.stderr
    assert f"       changed  {GAA}:gen_alias_from_base" in diff.stdout
    assert "+def gen_alias_from_base(  # patched" in diff.stdout
    assert f"1 of {len(_mirrored.names())} mirrored pieces differ" in diff.stdout
