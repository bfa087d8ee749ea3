"""No Python of AOTAutograd's per-call runtime runs in a steady-state call.

Counts the Python frames whose code lives under ``torch/_functorch/`` (the
runtime wrappers, upstream's generated wrapper sources, which are compiled
with file names there, and every helper they call) during one call of a
compiled function that has already been called a few times, with
``sys.setprofile``: inference, and training (the forward and
``out.sum().backward()``), on plain tensors and on a tensor subclass
(``TwoTensor``). With the C path off the same count is taken too, and must be
positive: that is what shows the counter sees the frames at all.

CPU only: the profile function is per thread, and on CPU the autograd engine
runs the backward on the calling thread.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import _differential as D

FUNCTORCH = os.path.join("torch", "_functorch") + os.sep


def _frames(step) -> list[str]:
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and FUNCTORCH in frame.f_code.co_filename.replace("/", os.sep):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return seen


def f_affine(x):
    return x * 2 + 1


def f_alias(x):
    return x.view(-1), x * 2


def _input(kind, training):
    torch.manual_seed(0)
    if kind == "plain":
        x = torch.randn(8)
    else:
        x = TwoTensor(torch.randn(8), torch.randn(8))
    return x.requires_grad_() if training else x


def _step(fn, kind, training):
    def step():
        x = _input(kind, training)
        out = compiled(x)
        if training:
            out = out if isinstance(out, torch.Tensor) else out[-1]
            out.sum().backward()

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for _ in range(3):  # compile, first invocation, warm
        step()
    return step


def _count(fn, kind, training, use_c):
    torch._dynamo.reset()
    with D.runtime(use_c):
        step = _step(fn, kind, training)
        return _frames(step)


CASES = [
    ("plain", f_affine, False),
    ("plain", f_affine, True),
    ("subclass", f_affine, False),
    ("subclass", f_affine, True),
    ("subclass", f_alias, False),
]


def _id(case):
    kind, fn, training = case
    return f"{kind}-{fn.__name__}-{'training' if training else 'inference'}"


# An output aliasing a subclass input has no ViewMeta sequence (metadata traced
# at the subclass level records none), so the runtime wrapper's alias replay
# calls upstream's gen_alias_from_base for its _view_func branch (2 frames:
# gen_alias_from_base, patch_requires_grad); csrc/epilogue.c replays in C only
# a recorded ViewMeta sequence.
KNOWN = {
    "subclass-f_alias-inference": "alias replay without a ViewMeta sequence: upstream's "
                                  "gen_alias_from_base (_view_func branch)",
}


@pytest.mark.skipif(not D.C_ENABLED, reason="needs the C path")
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_no_functorch_frames(case, request):
    kind, fn, training = case
    name = _id(case)
    upstream = _count(fn, kind, training, use_c=False)
    assert upstream, "the counter saw no frame of upstream's runtime: it cannot be trusted"
    ours = _count(fn, kind, training, use_c=True)
    if name in KNOWN:
        request.node.add_marker(pytest.mark.xfail(reason=KNOWN[name], strict=True))
    assert ours == [], f"{len(ours)} frames (upstream: {len(upstream)}): {ours[:20]}"
