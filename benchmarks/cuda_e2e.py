"""Wall time per call of a small compiled model, upstream's AOTAutograd runtime
against torch_aot_rt's, in one process (the CUDA table of docs/benchmarks.md).

    python benchmarks/cuda_e2e.py [--device cuda|cpu] [--rounds 15] [--calls 200] [--json FILE]

The model is a 3-layer MLP (Linear 64->64, ReLU, Linear 64->64, ReLU, Linear
64->64; batch 32), compiled by inductor, in four rows:

``inference`` / ``inference_ro``
    ``mlp(x)`` under ``torch.no_grad()``, ``mode="default"`` / ``"reduce-overhead"``
``training`` / ``training_ro``
    ``mlp(x).sum().backward()`` (parameters require grad), the same two modes

With ``mode="reduce-overhead"`` on CUDA the compiled graph is replayed as a CUDA
graph, so what is left of a call is mostly CPU work: Dynamo's guards,
AOTAutograd's runtime (what this package replaces) and cudagraph trees' own
bookkeeping. The ``replay`` variant of ``inference_ro`` is the floor of such a
call: the eager model captured once with ``torch.cuda.graph`` and replayed.

Variants: ``eager``, ``upstream`` (compiled with torch_aot_rt off: the choice is
made at the first call), ``c`` (on), and ``replay`` where it applies. Each round
runs every variant ``calls`` times, in an order rotated from round to round,
with ``torch.cuda.synchronize()`` before the clock starts and before it stops,
so a time per call covers the GPU work too where the CPU does not hide it. The
table gives the median over rounds of the time per call, and ``c - up`` the
median of the per-round differences (paired: same round, same noise).
``cudagraph_mark_step_begin`` is called before every compiled call in the
``_ro`` rows (upstream and C alike), as a training loop over cudagraph trees
does.

Before timing, each row checks that the C path was used for the C compile
(``torch_aot_rt.stats()``: a runtime wrapper built, a CompiledFunction with
grads, no fallback) and that upstream and C give equal outputs (and grads); a
row that fails either is still timed, printed with the failure, and the script
exits 1 at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import _cases  # noqa: E402  (TORCH_AOT_RT=0 default, loads torch_aot_rt)

import torch  # noqa: E402

ROWS = {
    # row: (training, mode)
    "inference": (False, "default"),
    "inference_ro": (False, "reduce-overhead"),
    "training": (True, "default"),
    "training_ro": (True, "reduce-overhead"),
}
WIDTH, BATCH = 64, 32


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
    ).to(device)


def _forward(model, x):
    return model(x)


def _fresh_copy(fn, tag):
    # a distinct code object: Dynamo keeps one cache entry per compiled copy
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name)


def _call(fn, model, x, training, mark_step):
    """One call as the row makes it: a closure over the compiled (or eager) fn."""
    if training:
        def run():
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            fn(model, x).sum().backward()
    else:
        def run():
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                return fn(model, x)
    return run


def _compile(rt, flag, tag, model, x, training, mode, warmup):
    compiled = torch.compile(_fresh_copy(_forward, tag), mode=mode, fullgraph=True)
    run = _call(compiled, model, x, training, mode == "reduce-overhead")
    before = rt.stats()
    with rt.enabled(flag):
        for _ in range(warmup):
            run()
    after = rt.stats()
    delta = {k: after[k] - before[k] for k in ("runtime_wrappers", "autograd_functions", "fallbacks")}
    return compiled, run, delta


def _replay(model, x):
    """The eager model captured as one CUDA graph, replayed: a graphed call's floor."""
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        model(static_x)
    return graph.replay


def _outputs_equal(model, x, training, up, c, mark_step):
    """Upstream's and C's compiled functions give equal outputs (and grads)."""
    results = []
    for fn in (up, c):
        model.zero_grad(set_to_none=True)
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        if training:
            out = fn(model, x)
            out.sum().backward()
            results.append([out.detach().clone()] + [p.grad.clone() for p in model.parameters()])
        else:
            with torch.no_grad():
                results.append([fn(model, x).clone()])
    model.zero_grad(set_to_none=True)
    return all(torch.equal(a, b) for a, b in zip(*results))


def _time(runs, rounds, calls, sync):
    samples = {n: [] for n in runs}
    names = list(runs)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        gc.collect()
        for name in order:
            run = runs[name]
            gc.disable()
            try:
                sync()
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    run()
                sync()
                t1 = time.perf_counter_ns()
            finally:
                gc.enable()
            samples[name].append((t1 - t0) / calls / 1000.0)
    return samples


def measure(row, device, rounds, calls, warmup=5):
    rt = _cases.torch_aot_rt
    if rt is None or _cases._C is None:
        raise SystemExit(f"torch_aot_rt's C extension is not available: {_cases.C_UNAVAILABLE}")
    training, mode = ROWS[row]
    model = _model(device)
    x = torch.randn(BATCH, WIDTH, device=device)
    mark_step = mode == "reduce-overhead"
    up, up_run, _ = _compile(rt, False, f"{row}_up", model, x, training, mode, warmup)
    c, c_run, delta = _compile(rt, True, f"{row}_c", model, x, training, mode, warmup)
    # what would make the row meaningless is said with it, not fatal: on a
    # machine lent for minutes, the other rows still come back
    notes = []
    if not (delta["runtime_wrappers"] >= 1 and delta["fallbacks"] == 0
            and delta["autograd_functions"] >= (1 if training else 0)):
        notes.append(f"the C path was not used for the C compile: stats delta {delta}")
    if not _outputs_equal(model, x, training, up, c, mark_step):
        notes.append("upstream's and C's outputs differ")
    runs = {"eager": _call(_forward, model, x, training, False), "upstream": up_run, "c": c_run}
    if device == "cuda" and row == "inference_ro":
        runs["replay"] = _replay(model, x)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    samples = _time(runs, rounds, calls, sync)
    med = {n: statistics.median(v) for n, v in samples.items()}
    saved = statistics.median(u - c for u, c in zip(samples["upstream"], samples["c"]))
    return {"row": row, "mode": mode, "training": training, "median_us": med,
            "c_minus_up_us": -saved, "c_over_up": med["c"] / med["upstream"], "notes": notes}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rows", nargs="*", default=list(ROWS))
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args(argv)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {args.device} ({name}), "
          f"{args.rounds} rounds x {args.calls} calls; microseconds per call, median over rounds")
    print(f"{'row':<14}{'eager':>9}{'upstream':>10}{'c':>9}{'replay':>9}{'c - up':>9}{'c / up':>8}")
    results = []
    for row in args.rows:
        r = measure(row, args.device, args.rounds, args.calls)
        results.append(r)
        m = r["median_us"]
        replay = f"{m['replay']:9.1f}" if "replay" in m else f"{'-':>9}"
        print(f"{row:<14}{m['eager']:9.1f}{m['upstream']:10.1f}{m['c']:9.1f}{replay}"
              f"{r['c_minus_up_us']:9.1f}{r['c_over_up']:8.3f}", flush=True)
        for note in r["notes"]:
            print(f"  {row}: {note}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": name, "results": results}, f, indent=1)
    if any(r["notes"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
