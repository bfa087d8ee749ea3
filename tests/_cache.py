"""AOTAutogradCache's settings for the tests of cache hits, and the backend whose
compiles the cache saves under them on the installed torch."""

from __future__ import annotations

import torch
from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

import _differential as D

BUNDLED_CACHE = {
    k: v
    for k, v in {
        "enable_autograd_cache": True,
        "force_autograd_cache": True,  # not on every torch the canaries run
        "bundled_autograd_cache": True,
    }.items()
    if hasattr(torch._functorch.config, k)
}


_CACHE_BACKEND = []


def cache_backend() -> str:
    """The backend whose compiles AOTAutogradCache saves under BUNDLED_CACHE:
    aot_eager where upstream bundles its entries; 2.11's bundled cache fails
    an aot_eager compile (AssertionError "expected OutputCode"), so there
    inductor (probed once, upstream's runtime)."""
    if not _CACHE_BACKEND:
        torch._dynamo.reset()
        AOTAutogradCache.clear()
        backend = "aot_eager"
        with D.runtime(False), torch._functorch.config.patch(**BUNDLED_CACHE), \
                torch._dynamo.config.patch(suppress_errors=False):
            try:
                torch.compile(lambda x: (x * 2,), backend="aot_eager")(torch.randn(2))
            except torch._dynamo.exc.BackendCompilerFailed as e:
                if "expected OutputCode" not in str(e):
                    raise
                backend = "inductor"
        AOTAutogradCache.clear()
        torch._dynamo.reset()
        _CACHE_BACKEND.append(backend)
    return _CACHE_BACKEND[0]
