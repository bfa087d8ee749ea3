"""The C compile_wrapper against upstream's across threads: each thread's
own thread-local state, threads taking turns, and a context attribute set
between calls, C runtime off vs on (see test_compile_wrapper.py).
"""

from __future__ import annotations

import threading

import pytest
import torch

from _compile_wrapper_runs import C_CALL, _attempt, _v, differential, f, tls_state

pytestmark = pytest.mark.needs_c


def test_threads():
    """Calls from several threads at once: each thread's results and its
    state after the calls."""

    def program():
        g = torch.compile(f, backend="aot_eager")
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        g(x, w)
        results = {}

        def work(k):
            outs = [_v(g(x * k, w)) for _ in range(20)]
            results[k] = (outs, tls_state())

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [results[k] for k in range(4)]

    differential(program, min_c=40)


def test_thread_local_state_is_the_callers():
    """Dynamo's threading.local state is the calling thread's (C keeps each
    local's dict for the thread that called last): a fullgraph call in a
    worker resets and clears only the worker's skip reasons, and (2.14 on) a
    nested-eager depth set in a worker sends only the worker's calls to
    upstream's compile_wrapper, which runs the function eagerly there."""
    from torch._dynamo import eval_frame

    tls = eval_frame.dynamo_tls
    nested = getattr(eval_frame, "_force_eager_nested_compile", None)

    def program():
        g = torch.compile(f, backend="aot_eager", fullgraph=True)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        rows = [_v(g(x, w))]
        tls.skip_reasons = ["main's"]
        results = {}

        def work():
            if nested is not None:
                nested.depth = 1
            outs = [_v(g(x, w)) for _ in range(3)]
            results["worker"] = (outs, getattr(tls, "skip_reasons", "unset"))

        try:
            rows.append(_v(g(x, w)))  # the main thread's dict, remembered
            tls.skip_reasons = ["main's"]
            t = threading.Thread(target=work)
            t.start()
            t.join()
            rows += [results["worker"], tls.skip_reasons, getattr(nested, "depth", None)]
            rows += [_v(g(x, w)), tls.skip_reasons]
        finally:
            tls.skip_reasons = None
        return rows

    off, counts = differential(program, min_c=3)
    if nested is not None:
        # the worker's three calls were upstream's: only the main thread's in C
        assert counts[C_CALL] == 3, counts


def test_threads_taking_turns():
    """Four threads calling one compiled function in turn (C remembers each
    thread's dict of each local): each sees its own thread-local state on
    every call, the one with a nested-eager depth (2.14 on) or fullgraph skip
    reasons of its own included, and the results are upstream's."""
    from torch._dynamo import eval_frame

    tls = eval_frame.dynamo_tls
    nested = getattr(eval_frame, "_force_eager_nested_compile", None)
    n = 4

    def program():
        g = torch.compile(f, backend="aot_eager", fullgraph=True)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        g(x, w)
        turn = [threading.Event() for _ in range(n)]
        seen = {i: [] for i in range(n)}

        def work(i):
            tls.skip_reasons = [f"thread {i}'s"]
            if nested is not None and i == 2:
                nested.depth = 1
            for _ in range(3):
                turn[i].wait()
                turn[i].clear()
                seen[i].append((_v(g(x, w)), getattr(tls, "skip_reasons", "unset"),
                                getattr(nested, "depth", None)))
                turn[(i + 1) % n].set()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        turn[0].set()
        for t in threads:
            t.join()
        return seen

    _, counts = differential(program, min_c=1)
    if nested is not None:
        # thread 2's three calls were upstream's, the others' nine in C
        assert counts[C_CALL] == 1 + 9, counts


def test_context_attribute_set_between_calls():
    """An attribute of the context set between calls (C remembers the ones
    a call reads while the context's dict is unchanged): error_on_graph_break
    set on the context, then put back, is what the next call sets around
    the function, as upstream's reads it on each call."""
    seen = []

    @torch.compiler.disable
    def probe(x):
        seen.append(torch._dynamo.utils._get_error_on_graph_break())
        return x

    def h(x):
        return probe(x + 1) * 2

    def program():
        seen.clear()
        ctx = torch._dynamo.optimize("aot_eager")
        g = ctx(h)
        x = torch.randn(3)
        rows = [_attempt(lambda: _v(g(x))) for _ in range(2)]
        ctx.error_on_graph_break = True
        rows += [_attempt(lambda: _v(g(x))) for _ in range(2)]
        ctx.error_on_graph_break = None
        rows += [_attempt(lambda: _v(g(x))) for _ in range(2)]
        return rows, list(seen)

    r, _ = differential(program, min_c=4)
    assert True in r[1] and r[1][-1] is not True, r
