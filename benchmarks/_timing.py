"""Interleaved timing: rounds alternate the variants so noise hits all alike."""

from __future__ import annotations

import contextlib
import gc
import itertools
import statistics
import time
from typing import Callable


def time_calls(run: Callable[[], object], number: int) -> float:
    """ns per call of ``run`` over ``number`` calls (gc disabled, like timeit)."""
    it = itertools.repeat(None, number)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in it:
            run()
        t1 = time.perf_counter_ns()
    finally:
        if gc_was_enabled:
            gc.enable()
    return (t1 - t0) / number


def calibrate(runs: dict[str, Callable[[], object]], target_s: float) -> int:
    """Calls per measurement so that the slowest variant takes ~target_s."""
    slowest = 0.0
    for run in runs.values():
        n = 10
        while True:
            ns = time_calls(run, n)
            if ns * n > 2e6 or n >= 1 << 20:  # >2 ms: good enough an estimate
                break
            n *= 4
        slowest = max(slowest, ns)
    return max(10, int(target_s * 1e9 / max(slowest, 1.0)))


def interleaved(
    runs: dict[str, Callable[[], object]],
    *,
    rounds: int,
    number: int,
    context: Callable[[], object] | None = None,
    switched: Callable[[str], object] | None = None,
) -> dict[str, list[float]]:
    """ns/call per round for each variant; each round runs every variant once,
    in an order rotated from round to round. ``switched(variant)``: a context
    each variant's calls run in (the C runtime's switch, _e2e)."""
    names = list(runs)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        gc.collect()
        for name in order:
            with contextlib.ExitStack() as stack:
                if context is not None:
                    stack.enter_context(context())
                if switched is not None:
                    stack.enter_context(switched(name))
                samples[name].append(time_calls(runs[name], number))
    return samples


def summarize(samples: dict[str, list[float]], base: str) -> dict:
    """Medians and mins per variant; overheads over ``base`` as the median of
    per-round differences (paired: same round, same noise) and as min - min."""
    out: dict = {"median": {}, "min": {}, "overhead": {}, "overhead_min": {}}
    for name, xs in samples.items():
        out["median"][name] = statistics.median(xs)
        out["min"][name] = min(xs)
    for name, xs in samples.items():
        if name == base:
            continue
        diffs = [a - b for a, b in zip(xs, samples[base])]
        out["overhead"][name] = statistics.median(diffs)
        out["overhead_min"][name] = min(xs) - min(samples[base])
    return out


def ratio_quartiles(samples: dict[str, list[float]], base: str, num: str, den: str):
    """p25, p75 over rounds of (num - base) / (den - base): the spread of the ratio."""
    if num not in samples or den not in samples:
        return None
    ratios = sorted(
        (n - b) / (d - b)
        for n, d, b in zip(samples[num], samples[den], samples[base])
        if d - b > 0
    )
    if len(ratios) < 2:
        return None
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return q[0], q[2]
