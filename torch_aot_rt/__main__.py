"""``python -m torch_aot_rt``: where this interpreter and torch stand.

Prints the Python and torch versions and the interpreter's build kind, the
gate's decision for this pair (and why, where it is inactive), the C++
part's build record, and a self-check: one compiled function (forward and
backward) run with the C path off and then on, its results compared, and
what ran in C. Exits 1 when the self-check finds a difference, else 0
(an inactive pair included: there the package changes nothing).
"""

from __future__ import annotations

import sys


def _self_check(torch_aot_rt) -> tuple[bool, str]:
    """(results equal, what ran in C) for one compiled function, C path off
    and on (aot_eager: AOTAutograd's and Dynamo's layers, no code generation)."""
    import torch

    def f(x, y):
        y.add_(1)
        return x.sin() * y, x.view(-1)

    def run(on: bool):
        torch._dynamo.reset()
        with torch_aot_rt.enabled(on):
            g = torch.compile(f, backend="aot_eager")
        out = []
        for k in range(3):
            torch.manual_seed(k)
            x = torch.randn(3, 4, requires_grad=True)
            y = torch.randn(3, 4)
            a, b = g(x, y)
            a.sum().backward()
            out.append((a.detach(), b.detach(), b._base is x, y.clone(), x.grad,
                        a.requires_grad, type(a.grad_fn).__name__))
        return out

    upstream = run(False)
    before = torch_aot_rt.stats()
    ours = run(True)
    after = torch_aot_rt.stats()
    same = len(upstream) == len(ours) and all(
        all(torch.equal(u, o) if isinstance(u, torch.Tensor) else u == o
            for u, o in zip(us, os_))
        for us, os_ in zip(upstream, ours)
    )
    calls = (after["dynamo_compile_wrapper"].get("calls in C", 0)
             - before["dynamo_compile_wrapper"].get("calls in C", 0))
    fallbacks = {k: n - before["fallback_reasons"].get(k, 0)
                 for k, n in after["fallback_reasons"].items()
                 if n != before["fallback_reasons"].get(k, 0)}
    why = "; ".join(f"{n} x {k}" for k, n in fallbacks.items()) or "none"
    return same, f"{calls} of 3 calls of the compiled function in C; fallbacks: {why}"


def _built_from() -> str:
    """" (commit abc1234)", with "+" where the checkout had changes, from the
    record the build writes; "" where there is none."""
    import json
    import os

    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build.json")) as f:
            build = json.load(f)
    except (OSError, ValueError):
        return ""
    return f" (commit {build['commit'][:12]}{'+' if build.get('modified') else ''})"


def main() -> int:
    import torch

    import torch_aot_rt
    from torch_aot_rt import _state, _versions

    torch_aot_rt.enable()  # decides the gate (TORCH_AOT_RT=0 only skips the import's)
    gate = _state.gate()
    closed = _state.closed()
    stats = torch_aot_rt.stats()
    print(f"torch_aot_rt {torch_aot_rt.__version__}{_built_from()}")
    print(f"Python       {sys.version.split()[0]} ({gate.kind} build, {sys.executable})")
    print(f"torch        {torch.__version__}")
    if closed is None:
        how = " (TORCH_AOT_RT_UNVERIFIED=1 opt-in)" if gate.unverified_opt_in else ""
        print(f"gate         active{how}: torch {gate.release.name}'s semantics, "
              f"Python {_versions.python_name(gate.python)}")
    else:
        print(f"gate         inactive: {closed}")
    cpp = stats["cpp"]
    print("C++ part     " + (f"loaded ({cpp['module']})" if cpp["module"]
                             else f"not used: {cpp['reason']}"))
    same, what = _self_check(torch_aot_rt)
    print(f"self-check   {'same results' if same else 'RESULTS DIFFER'}, C path off and on; "
          f"{what}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
