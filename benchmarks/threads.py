"""Serving threads: instructions per call of one compiled function when several
threads call it in turn, against one thread.

    python benchmarks/threads.py [--calls 800] [--threads 4] [--row rto_inductor_no_grad]

A server runs the same compiled functions from a pool of threads. Dynamo's
per-thread state (threading.local objects) is read on every call; the C path
remembers each thread's dict of those locals (csrc/thread_local.c), so the
threads taking turns should cost what one thread does. Runs itself under
``valgrind --tool=callgrind`` (as benchmarks/callgrind.py does) and, per
variant (upstream, C) and thread count (1 and ``--threads``), counts the
instructions of ``calls`` calls made in a ring: each thread (inside the
row's context: grad mode is per thread) waits for its turn, makes one call
and hands the turn on; the same ring around a no-op is subtracted, so what
is left is the calls alone. Before measuring, each ring's
results are checked against the one-thread run's (exact).

Prints a table and, with ``--json PATH``, writes it.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import callgrind  # noqa: E402


def ring(run, threads: int, calls: int, context) -> list:
    """``calls`` calls of ``run``, taken in turn by ``threads`` threads, each
    inside ``context()`` (grad mode and the like are per thread); the results
    in call order."""
    turn = [threading.Event() for _ in range(threads)]
    results = [None] * calls

    def worker(i):
        with context():
            for k in range(i, calls, threads):
                turn[i].wait()
                turn[i].clear()
                results[k] = run()
                turn[(i + 1) % threads].set()

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    turn[0].set()
    for w in workers:
        w.join()
    return results


def _values(results) -> list:
    import torch

    return [r.tolist() if isinstance(r, torch.Tensor) else r for r in results]


def inner(helper: str, row: str, calls: int, threads: int) -> None:
    import gc

    from benchmarks import _e2e

    lib = ctypes.CDLL(helper)
    lib.cg_dump.argtypes = [ctypes.c_char_p]
    case = _e2e.build_e2e_cases([row])[row]
    checks = {}
    for variant in ("upstream", "c"):
        run = case.call(variant)
        one = _values(ring(run, 1, 40, case.context))
        many = _values(ring(run, threads, 40, case.context))
        checks[variant] = one == many
    gc.collect()
    gc.disable()
    lib.cg_start()
    for variant in ("upstream", "c", "noop"):
        run = (lambda: None) if variant == "noop" else case.call(variant)
        for n in (1, threads):
            ring(run, n, calls, case.context)  # warm: each thread's first calls
            lib.cg_zero()
            ring(run, n, calls, case.context)
            lib.cg_dump(f"{variant}|{n}".encode())
    lib.cg_stop()
    gc.enable()
    print("CG_NOTES " + json.dumps({"exact": checks}), flush=True)


def measure(row: str, calls: int, threads: int, keep: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as d:
        helper = callgrind.build_helper(d)
        if helper is None:
            raise SystemExit("threads.py: needs a C compiler and <valgrind/callgrind.h>")
        out = os.path.join(d, "cg.out")
        notes = callgrind._valgrind(
            out, ["--inner", helper, "--row", row, "--calls", str(calls),
                  "--threads", str(threads)], instr_atstart=False, script=__file__)
        if keep:
            import shutil

            os.makedirs(keep, exist_ok=True)
            for path in glob.glob(out + "*"):
                shutil.copy(path, keep)
        totals = {}
        for path in glob.glob(out + "*"):
            label, total = callgrind._read_dump(path)
            if label and label.count("|") == 1:
                variant, n = label.split("|")
                totals[(variant, int(n))] = total
    per_call = {
        (variant, n): (totals[(variant, n)] - totals[("noop", n)]) / calls
        for variant in ("upstream", "c") for n in (1, threads)
    }
    return {"row": row, "calls": calls, "threads": threads, "exact": notes["exact"],
            "per_call": {f"{v}|{n}": round(ir) for (v, n), ir in per_call.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=800)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--row", default="rto_inductor_no_grad")
    p.add_argument("--json")
    p.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps in DIR")
    p.add_argument("--inner")  # inside valgrind: the helper library
    args = p.parse_args(argv)
    if args.inner:
        inner(args.inner, args.row, args.calls, args.threads)
        return 0
    result = measure(args.row, args.calls, args.threads, args.keep)
    pc, n = result["per_call"], args.threads
    print(f"{args.row}: Ir per call, {args.calls} calls in a ring of 1 and {n} threads "
          f"(results exact: {result['exact']})")
    print(f"| variant | 1 thread | {n} threads | ratio |")
    print("|---|---:|---:|---:|")
    for v in ("upstream", "c"):
        print(f"| {v} | {pc[f'{v}|1']:,} | {pc[f'{v}|{n}']:,} | "
              f"{pc[f'{v}|{n}'] / pc[f'{v}|1']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
