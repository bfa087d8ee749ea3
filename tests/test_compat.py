"""Torch-version robustness: when internals we bind differ (as on older torch),
`import torch_aot_rt` still works and every compile falls back to upstream with
a reason in stats(), giving upstream's results. Simulated in a subprocess by
removing the internal before the import."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

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
    print(json.dumps(dict(
        stats=torch_aot_rt.stats(),
        same=torch.allclose(out[0], ref[0]) and torch.equal(y, ref_y)
             and torch.allclose(x.grad, ref_x.grad) and out[1]._base is x,
    )))
    """
)


def run(remove: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_AOT_RT"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(remove=remove)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_baseline_uses_c_path():
    result = run("")
    assert result["same"]
    assert result["stats"]["runtime_wrappers"] == 1
    assert result["stats"]["autograd_functions"] == 1
    assert result["stats"]["fallbacks"] == 0


@pytest.mark.parametrize(
    "remove, reason",
    [
        (
            "del torch._C._autograd._saved_tensors_hooks_get_disabled_error_message",
            "_saved_tensors_hooks_get_disabled_error_message",
        ),
        ("del torch._C._functorch.unwrap_if_dead", "unwrap_if_dead"),
    ],
)
def test_missing_binding_falls_back_everywhere(remove, reason):
    result = run(remove)
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 0 and stats["autograd_functions"] == 0
    assert stats["fallbacks"] == 2
    assert all(reason in r for r in stats["fallback_reasons"]), stats


def test_changed_compiled_function_internals_keep_c_runtime_wrapper():
    # A torch whose CompiledFunction closes over other names than we read.
    result = run(
        "import torch_aot_rt._autograd_plan as ap; ap._closure = lambda fn: {}"
    )
    assert result["same"]
    stats = result["stats"]
    assert stats["runtime_wrappers"] == 1 and stats["autograd_functions"] == 0
    (reason,) = stats["fallback_reasons"]
    assert reason.startswith("CompiledFunction: torch internals differ"), reason


def test_missing_first_invocation_context_still_c():
    # Older torch has no first-call custom-op aliasing check; neither do we then.
    result = run("del rw._FirstInvocationContext")
    assert result["same"]
    assert result["stats"]["runtime_wrappers"] == 1
    assert result["stats"]["fallbacks"] == 0
