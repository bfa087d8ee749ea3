"""The release the tests run on (``torch_aot_rt._versions``' entry for the
installed torch, or None) and helpers the release tests share.
"""

from __future__ import annotations

import torch

from torch_aot_rt import _versions


GATE = _versions.resolve(torch.__version__)
RELEASE = GATE.release

def _calling_first(observe):
    """A boxed compiler whose graph calls ``observe()`` before running: what
    the compiled backward sees when it runs."""

    def compiler(gm, example_inputs):
        def run(args):
            observe()
            return gm(*args)

        run._boxed_call = True
        return run

    return compiler


def _seeded(seed=0):
    torch._dynamo.reset()
    torch.manual_seed(seed)
