"""torch_aot_rt demo: the same compiled model with the C runtime off and on.

A small MLP with a BatchNorm (parameters and buffers; in training the graph updates
the running stats in place and the wrapper bumps their version counters) is compiled with
``torch.compile(backend="aot_eager")`` (``--backend inductor`` for inductor), then:

* an inference call under ``torch.no_grad()``;
* a training step: forward, cross-entropy loss, backward, SGD step.

Each is run twice, from identical weights: once compiled with torch_aot_rt off
(upstream's runtime wrapper and CompiledFunction) and once with it on.
``torch_aot_rt.enabled(flag)`` only matters while AOTAutograd builds the wrapper,
which happens at the first call after ``torch.compile``; the compiled model keeps
that wrapper afterwards.
``torch._dynamo.reset()`` between the two makes the second one compile afresh.

Printed: whether results agree (outputs, losses, gradients, updated parameters
and buffers), the median cost of a call, and ``torch_aot_rt.stats()``.
Phases run one after another (off/on, then on/off, ...): the machine is noisy, so
read the on/off ratio, not the absolute numbers; benchmarks/ measures carefully.

    python examples/demo.py [--backend aot_eager|inductor] [--calls N] [--steps N]

Exit status: 0 when every result agrees exactly, 1 otherwise (or when the C path
cannot be switched on).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import torch_aot_rt
except Exception as exc:  # the C extension missing or failing to bind
    sys.exit(
        f"demo: import torch_aot_rt failed: {type(exc).__name__}: {exc}\n"
        "  build it with `bash scripts/demo.sh` (or `pip install --no-build-isolation -e .`)"
    )

D_IN, HIDDEN, D_OUT, BATCH = 32, 64, 8, 16
TRAIN_CHECK_STEPS = 3  # steps compared off vs on, from identical weights


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D_IN, HIDDEN)
        self.bn = nn.BatchNorm1d(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, D_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def median_us(fn, n: int, warmup: int) -> tuple[float, list[int]]:
    for _ in range(warmup):
        fn()
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1e3, samples


def aot_compiles() -> int:
    from torch._dynamo.utils import counters

    return counters["aot_autograd"]["total"]


def c_path_available() -> str | None:
    """None if torch_aot_rt can be switched on, else why not."""
    try:
        with torch_aot_rt.enabled(True):
            pass
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def run_inference(flag, state, x, args):
    """Compile with the C path `flag`, call once, then time `args.calls` calls."""
    torch._dynamo.reset()
    model = MLP()
    model.load_state_dict(state)
    model.eval()
    before = torch_aot_rt.stats()
    with torch.no_grad():
        t0 = time.perf_counter()
        with torch_aot_rt.enabled(flag):
            cmodel = torch.compile(model, backend=args.backend)
            out = cmodel(x)  # first call: AOTAutograd builds the runtime wrapper here
        first_s = time.perf_counter() - t0
        built = aot_compiles()
        # From here on cmodel keeps the wrapper it was built with.
        us, _ = median_us(lambda: cmodel(x), args.calls, warmup=max(100, args.calls // 10))
    rebuilt = aot_compiles() - built
    return {
        "out": out,
        "us": us,
        "first_s": first_s,
        "rebuilt": rebuilt,
        "stats": stats_delta(before, torch_aot_rt.stats()),
    }


def run_training(flag, state, x, y, args):
    """Compile with the C path `flag`, take TRAIN_CHECK_STEPS steps, time `args.steps`."""
    torch._dynamo.reset()
    model = MLP()
    model.load_state_dict(state)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    before = torch_aot_rt.stats()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(cmodel(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    t0 = time.perf_counter()
    with torch_aot_rt.enabled(flag):
        cmodel = torch.compile(model, backend=args.backend)
        losses = [step()]  # first call: AOTAutograd builds the runtime wrapper here
    first_s = time.perf_counter() - t0
    built = aot_compiles()
    losses += [step() for _ in range(TRAIN_CHECK_STEPS - 1)]
    result = {
        "loss": torch.stack(losses),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
        "versions": {n: torch.tensor(b._version) for n, b in model.named_buffers()},
    }
    us, _ = median_us(step, args.steps, warmup=max(20, args.steps // 10))
    result.update(
        us=us,
        first_s=first_s,
        rebuilt=aot_compiles() - built,
        stats=stats_delta(before, torch_aot_rt.stats()),
    )
    return result


def eager_us(state, x, y, args):
    model = MLP()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        inf, _ = median_us(lambda: model(x), args.calls, warmup=100)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    train, _ = median_us(step, args.steps, warmup=20)
    return inf, train


def stats_delta(a: dict, b: dict) -> dict:
    reasons = {
        k: v - a["fallback_reasons"].get(k, 0)
        for k, v in b["fallback_reasons"].items()
        if v != a["fallback_reasons"].get(k, 0)
    }
    out = {k: b[k] - a[k] for k in ("runtime_wrappers", "autograd_functions", "fallbacks")}
    out["fallback_reasons"] = reasons
    return out


def compare(a, b) -> tuple[float, bool]:
    """(max abs diff, exactly equal) over tensors or dicts of tensors."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        pairs = [(a[k], b[k]) for k in a]
    else:
        pairs = [(a, b)]
    diff, exact = 0.0, True
    for t, u in pairs:
        exact = exact and t.shape == u.shape and t.dtype == u.dtype and torch.equal(t, u)
        if t.shape == u.shape and t.numel():
            diff = max(diff, (t.double() - u.double()).abs().max().item())
    return diff, exact


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="aot_eager", choices=["aot_eager", "inductor"])
    p.add_argument("--calls", type=int, default=2000, help="timed inference calls per phase")
    p.add_argument("--steps", type=int, default=200, help="timed training steps per phase")
    p.add_argument("--rounds", type=int, default=4,
                   help="off/on phase pairs, order alternating (off,on / on,off / ...)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: a tiny model gains nothing from more, "
                        "and spinning threads make timings noisy on a busy machine)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    state = MLP().state_dict()
    x = torch.randn(BATCH, D_IN)
    y = torch.randint(0, D_OUT, (BATCH,))

    print(
        f"torch_aot_rt {torch_aot_rt.__version__} demo | torch {torch.__version__} | "
        f"backend={args.backend} | threads={args.threads} | MLP {D_IN}-{HIDDEN}(BatchNorm1d)-{D_OUT}, batch {BATCH}"
    )
    print(f"TORCH_AOT_RT on at import: {torch_aot_rt.is_enabled()}")
    why_not = c_path_available()
    if why_not is not None:
        print(f"\n!! the C path cannot be switched on: {why_not}")
        print("!! showing upstream (off) only; build the extension: bash scripts/demo.sh\n")
    flags = [False] if why_not else [False, True]

    # One discarded round first: the first compile in a process pays one-time imports
    # and lazy initialisation that would otherwise land on whichever phase runs first.
    warm = argparse.Namespace(**{**vars(args), "calls": 50, "steps": 5})
    for flag in flags:
        run_inference(flag, state, x, warm)
        run_training(flag, state, x, y, warm)
    torch_aot_rt.reset_stats()

    res = {("inf", f): [] for f in flags} | {("train", f): [] for f in flags}
    for r in range(args.rounds):
        order = flags if r % 2 == 0 else flags[::-1]
        for flag in order:
            res[("inf", flag)].append(run_inference(flag, state, x, args))
        for flag in order:
            res[("train", flag)].append(run_training(flag, state, x, y, args))
    eager_inf, eager_train = eager_us(state, x, y, args)

    def med(kind, flag, key="us"):
        return statistics.median(r[key] for r in res[(kind, flag)])

    def cell(kind, flag, width):
        vals = [r["us"] for r in res[(kind, flag)]]
        text = f"{statistics.median(vals):.1f} [{math.floor(min(vals))}-{math.ceil(max(vals))}]"
        return f"{text:>{width}}"

    # ---- cost -------------------------------------------------------------------
    print(f"\nCost per call in µs: median of {args.calls} inference calls / {args.steps} "
          f"training steps per phase; median [min-max] over {args.rounds} rounds")
    hdr = f"{'':30}{'upstream (off)':>18}{'torch_aot_rt (on)':>19}{'on/off':>8}{'eager':>8}"
    print(hdr)
    print("-" * len(hdr))
    for kind, label, eager in (("inf", "inference call (no_grad)", eager_inf),
                               ("train", "training step (fwd+bwd+SGD)", eager_train)):
        off = med(kind, False)
        if True in flags:
            on = f"{cell(kind, True, 19)}{med(kind, True) / off:8.2f}"
        else:
            on = f"{'-':>19}{'-':>8}"
        print(f"{label:30}{cell(kind, False, 18)}{on}{eager:8.1f}")
    for kind, label in (("inf", "first call incl. compile, s"), ("train", "first step incl. compile, s")):
        off = med(kind, False, "first_s")
        on = f"{med(kind, True, 'first_s'):19.2f}" if True in flags else f"{'-':>19}"
        print(f"{label:30}{off:18.2f}{on}")

    # ---- agreement --------------------------------------------------------------
    ok = why_not is None
    if True in flags:
        print(f"\nAgreement, off vs on (every round; training after {TRAIN_CHECK_STEPS} steps "
              f"from identical weights)")
        hdr = f"{'':34}{'max |diff|':>12}{'exact':>8}"
        print(hdr)
        print("-" * len(hdr))
        rows = [("inference output", "inf", "out")]
        rows += [
            ("training losses", "train", "loss"),
            ("gradients", "train", "grads"),
            ("parameters after SGD", "train", "params"),
            ("buffers (BatchNorm running stats)", "train", "buffers"),
            ("buffer version counters", "train", "versions"),
        ]
        for label, kind, key in rows:
            diff, exact = 0.0, True
            for off_r, on_r in zip(res[(kind, False)], res[(kind, True)]):
                d, e = compare(off_r[key], on_r[key])
                diff, exact = max(diff, d), exact and e
            ok = ok and exact
            print(f"{label:34}{diff:12.3g}{'yes' if exact else 'NO':>8}")

    # ---- what was built ---------------------------------------------------------
    print("\nBuilt per phase (stats() delta: C runtime wrappers / C autograd functions / fallbacks)")
    for (kind, flag), runs in res.items():
        s = runs[0]["stats"]
        name = f"{'inference' if kind == 'inf' else 'training'}, {'on ' if flag else 'off'}"
        reasons = f"  reasons: {s['fallback_reasons']}" if s["fallback_reasons"] else ""
        print(f"  {name:16} {s['runtime_wrappers']} / {s['autograd_functions']} / {s['fallbacks']}{reasons}")
        if flag and s["runtime_wrappers"] == 0:
            print("    !! no C runtime wrapper was built: this phase ran upstream's fallback")
        if not flag and s["runtime_wrappers"]:
            print("    !! a C runtime wrapper was built with the C path off")
            ok = False
        if any(r["rebuilt"] for r in runs):
            print("    !! recompiled after the first call: timings mix wrappers")
    print(f"\ntorch_aot_rt.stats(): {torch_aot_rt.stats()}")
    print("\nRESULT:", "results agree exactly" if ok else "NOT OK (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
