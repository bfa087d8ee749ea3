"""Inductor's per-call layer, ``CompiledFxGraph.__call__``, in C
(``_C.GraphCall``, csrc/inductor/graph_call.c).

Every call of a graph inductor compiled goes through the class's
``__call__`` (whoever holds the graph: AOTAutograd's runtime wrapper, the C
CompiledFunction, the compiled backward's wrapper), so the class attribute
is what we replace, with a C method object that runs upstream's where the
state is not the steady one. Which graphs run in C is decided when each is
compiled (or loaded from a cache): ``post_compile``, which every path runs
before the graph's first call, marks it when the C runtime is on.
"""

from __future__ import annotations

import functools


def install():
    """Replace ``CompiledFxGraph.__call__`` and wrap its ``post_compile``;
    the Replaced records, or why they stay upstream's. What it mirrors is
    fingerprinted (``_mirrored``)."""
    import torch._dynamo.metrics_context as metrics_context
    import torch._dynamo.utils as dynamo_utils
    import torch._inductor.debug as inductor_debug
    import torch._inductor.output_code as output_code
    from torch._inductor.runtime.autotune_cache import AutotuneCacheBundler

    from . import _C, _state

    cls = output_code.CompiledFxGraph
    upstream = cls.__dict__.get("__call__")
    code = getattr(upstream, "__code__", None)
    if code is None or code.co_varnames[:2] != ("self", "inputs") or code.co_argcount != 2:
        return "CompiledFxGraph.__call__ is not the verified one"
    upstream_post_compile = cls.__dict__.get("post_compile")
    if not callable(upstream_post_compile):
        return "CompiledFxGraph.post_compile is not the verified one"
    release = _state.release()
    ours = _C.GraphCall(
        upstream=upstream,
        debug=inductor_debug,
        utils=dynamo_utils,
        metrics_cls=metrics_context.RuntimeMetricsContext,
        bundler_cls=AutotuneCacheBundler,
        compile_context=release.graph_call_compile_context,
        assert_message=release.graph_call_assert_message,
    )

    @functools.wraps(upstream_post_compile)
    def post_compile(self, *args, **kwargs):
        result = upstream_post_compile(self, *args, **kwargs)
        if _state.is_enabled():
            _C._graph_call_mark(self)
        return result

    return [_state.replace(cls, "__call__", ours), _state.replace(cls, "post_compile", post_compile)]
