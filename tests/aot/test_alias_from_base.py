"""gen_alias_from_base without a ViewMeta sequence, in C (csrc/aot/alias_from_base.c).

An output that aliases an input (or an intermediate) is regenerated from its
base. Where no ViewMeta sequence is replayed (view replay off, a tensor
subclass's outputs, a sequence with symbolic inputs), upstream takes the
traced output's autograd view function (``target._view_func``), reshaping the
base with ``as_strided`` first when its geometry differs from the traced
base's, and falls back to ``as_strided`` on the target's geometry (through
``view_as_real`` / ``view_as_complex`` when exactly one of them is complex,
then a dtype view). 2.14 adds the base's storage offset when the target lives
on another storage (``Release.alias_translates_storage_offset``).

Each branch is reached by a wrapper built from a real compile whose compiled
function returns a chosen tensor (test_direct.py's technique): C against
upstream, everything observable compared, under a TorchFunctionMode that logs
the calls each makes (the same calls, in the same order).
"""

from __future__ import annotations

import gc

import pytest
import torch

import _differential as D
from _modes import RecordingFunctionMode as Log
from torch_aot_rt import _state


def f_alias_only(a, b):
    return a.t(), b


def _offset_input(shape, dtype=torch.float32, offset=6):
    """A view input at a non-zero storage offset (what the offset
    translation reads)."""
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + offset + 3, dtype=dtype)[offset:offset + n].view(shape)


# name -> (runtime input a, the graph's output 0 made from the runtime args)
BRANCHES = {
    # target._base is the input itself: `abt is b`, no geometry check
    "view_func_same_base": (lambda: torch.randn(3, 4), lambda args: args[0].t()),
    # a base of the same geometry elsewhere: compared, not reshaped
    "view_func_like_base": (lambda: torch.randn(3, 4), lambda args: args[0].clone().t()),
    # a base of another geometry: the input is reshaped with as_strided first
    "view_func_reshaped_base": (
        lambda: _offset_input((3, 4)),
        lambda args: torch.zeros(2, 6).view(4, 3),
    ),
    # not a view: as_strided on the target's geometry (the offset translated
    # on 2.14 on: the storages differ)
    "as_strided": (lambda: _offset_input((3, 4)), lambda args: torch.zeros(4, 3)),
    "as_strided_complex_base": (
        lambda: _offset_input((3, 4), torch.complex64),
        lambda args: torch.zeros(4, 3, 2),
    ),
    "as_strided_complex_target": (
        lambda: _offset_input((6, 2)),
        lambda args: torch.zeros(4, dtype=torch.complex64),
    ),
    "as_strided_dtype_view": (
        lambda: _offset_input((3, 4)),
        lambda args: torch.zeros(4, 3, dtype=torch.int32),
    ),
}


def _wrapper_pair(training, produce):
    real_fn, kwargs = D.capture_wrapper_kwargs(
        f_alias_only,
        [torch.randn(3, 4, requires_grad=training), torch.randn(2, requires_grad=training)],
    )

    def compiled(args):
        return [produce(args), args[1]]

    compiled._boxed_call = True
    with torch._functorch.config.patch(view_replay_for_aliased_outputs=False):
        return D.build_pair(compiled, kwargs)


def _call_both(up, ours, make_a, input_requires_grad):
    recs, logs = [], []
    for w in (up, ours):
        torch.manual_seed(0)
        a = make_a()
        if input_requires_grad and a.is_floating_point():
            a = a.detach().requires_grad_()
        args = (a, torch.randn(2))
        log = []

        def call(x, w=w, log=log):
            with Log(log):
                return w(list(x))

        recs.append(D.observe_call(call, D.Inputs(args), backward=False))
        logs.append(log)
    D.assert_same(recs[0], recs[1], "gen_alias_from_base")
    assert logs[0] == logs[1], "\n".join(map(str, logs))
    return recs[0], logs[0]


@pytest.mark.parametrize("input_requires_grad", [False, True], ids=["input", "input_rg"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_branch(branch, training, input_requires_grad):
    make_a, produce = BRANCHES[branch]
    up, ours = _wrapper_pair(training, produce)
    rec, log = _call_both(up, ours, make_a, input_requires_grad)
    assert rec["error"] is None, rec["error"]
    # the branch was taken as named: the calls upstream made under the mode
    if branch.startswith("view_func"):
        assert "as_strided" not in log or branch == "view_func_reshaped_base", log
        assert ("as_strided" in log) == (branch == "view_func_reshaped_base"), log
    else:
        assert "as_strided" in log, log
    if branch == "as_strided_complex_base":
        assert "view_as_real" in log, log
    if branch == "as_strided_complex_target":
        assert "view_as_complex" in log, log


def test_storage_offset_translation_follows_the_release():
    """On a target of another storage, upstream's as_strided takes offset 0
    (2.13) or the input's 6 (2.14 on); the field says which, and upstream's
    result agrees with it (ours is compared with upstream's above)."""
    up, _ = _wrapper_pair(False, BRANCHES["as_strided"][1])
    torch.manual_seed(0)
    out = up([_offset_input((3, 4)), torch.randn(2)])[0]
    if not D.C_ENABLED:
        pytest.skip("needs the C path's release table")
    expected = 6 if _state.release().alias_translates_storage_offset else 0
    assert out.storage_offset() == expected, (torch.__version__, out.storage_offset())


def test_errors_match():
    """A target whose view function cannot apply to the base: the same error."""
    up, ours = _wrapper_pair(False, lambda args: torch.zeros(5, 7).view(7, 5))
    rec, _ = _call_both(up, ours, lambda: torch.randn(3, 4), False)
    assert rec["error"] is not None


def test_no_leak_over_many_calls():
    up, ours = _wrapper_pair(True, BRANCHES["view_func_reshaped_base"][1])
    a = _offset_input((3, 4)).detach().requires_grad_()
    b = torch.randn(2)

    def run(n):
        for _ in range(n):
            ours([a, b])

    run(50)
    gc.collect()
    before = len(gc.get_objects())
    run(500)
    gc.collect()
    assert len(gc.get_objects()) - before < 50
