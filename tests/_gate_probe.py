"""The gate, probed in a fresh interpreter: a compiled training step run with the
package imported (a line of the caller's run first, to break something on
purpose), its stats and whether its results are upstream's, as JSON."""

from __future__ import annotations

import json
import os
import textwrap

import _fresh_python as fresh_python

SCRIPT = textwrap.dedent(
    """
    import json, torch, torch._dynamo
    import torch._functorch._aot_autograd.runtime_wrappers as rw
    {remove}
    import torch_aot_rt
    from functorch.compile import aot_function, nop

    def f(x, y):
        y.add_(1)
        return x.sin() * y, x.view(-1)

    x = torch.randn(3, 4, requires_grad=True)
    y = torch.randn(3, 4)
    out = aot_function(f, fw_compiler=nop, bw_compiler=nop)(x, y)
    out[0].sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    ref_y = y.clone() - 1
    ref = f(ref_x, ref_y)
    ref[0].sum().backward()
    import sys
    print(json.dumps(dict(
        stats=torch_aot_rt.stats(),
        loaded_cpp=sorted(m for m in sys.modules if "._torch_cpp_" in m),
        same=torch.allclose(out[0], ref[0]) and torch.equal(y, ref_y)
             and torch.allclose(x.grad, ref_x.grad) and out[1]._base is x,
    )))
    """
)


def _candidate() -> bool:
    """The installed torch is a candidate release (2.11, 2.12) this run opted
    into: the C path runs on it only under the opt-in, which the runs of the
    installed torch as it is pass on."""
    import torch
    from torch_aot_rt import _versions

    gate = _versions.resolve(str(torch.__version__))
    return gate.unverified_opt_in and gate.release in _versions.CANDIDATES


CANDIDATE = _candidate()
INSTALLED = {"TORCH_AOT_RT_UNVERIFIED": "1"} if CANDIDATE else {}


def run(remove: str, **extra_env) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCH_AOT_RT", "TORCH_AOT_RT_UNVERIFIED")
    }
    env.update(extra_env)
    proc = fresh_python.run(SCRIPT.format(remove=remove), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
