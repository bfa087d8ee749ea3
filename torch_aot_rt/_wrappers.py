"""The other per-call compiler wrappers of ``runtime_wrappers.py``, in C.

Besides the runtime wrapper and CompiledFunction, AOTAutograd wraps a
compiled graph in more layers when its metadata asks for them, each a
``CompilerWrapper`` whose ``post_compile`` generates a small Python function
that then runs on every call:

- ``AOTDedupeWrapper`` (the same tensor passed twice, and mutated):
  ``debugged_compiled_fn`` -> ``_C.DedupeWrapper``;
- ``EffectTokensWrapper`` (effectful ops, e.g. ``aten._print`` or a custom op
  registered with effects): ``_effect_tokens_wrapper`` -> ``_C.EffectTokensWrapper``;
- ``AOTSyntheticBaseWrapper`` (inputs that alias each other, one mutated):
  ``_synthetic_base_wrapper`` -> ``_C.SyntheticBaseWrapper``;
- ``FunctionalizedRngRuntimeWrapper`` (``functionalize_rng_ops``, CUDA only):
  ``_functionalized_rng_wrapper`` -> ``_C.RngWrapper``;
- ``FakifiedOutWrapper`` (``TracingContext.fakify_first_call``): ``wrapper``
  -> ``_C.FakifiedOutWrapper``;
- ``DebugAssertWrapper`` (``config.debug_assert``): ``inner_fn`` ->
  ``_C.DebugAssertWrapper``.

On torch 2.12 three of them return a reference closure instead
(``Release.closure_compiler_wrappers``), and two of those wrap every compiled
function: ``EffectTokensWrapper``'s ``inner_fn`` (``_C.EffectTokensWrapper``
with tokens, else ``_C.ForwardingWrapper``) and
``FunctionalizedRngRuntimeWrapper``'s ``wrapper`` (``_C.ForwardingWrapper``
without RNG functionalization); ``AOTSyntheticBaseWrapper``'s closure stays
upstream's. On 2.11 the dedupe and debug-assert wrappers return closures
too (the same steps: ``_C.DedupeWrapper``, ``_C.DebugAssertWrapper``).

Ours is each class's ``post_compile``: it runs upstream's first (so every
build-time effect is upstream's: its checks and errors, the generated source
logged for TORCH_TRACE/tlparse and captured by ``compile_to_python``), then,
when upstream returned a generated function and the C path is on, builds the
C object from what that function reads (its globals or closure cells, i.e.
exactly the objects it would call) and gives it the function's identity
(``__name__``, ``__qualname__``, ``__module__``, ``__doc__``, its ``__dict__``
with ``__wrapped__`` and ``_boxed_call``). The generated function is kept in
the C object as ``upstream``: any call that is not the plain one runs it.
Anything not the verified shape, and any exception of ours while building,
returns upstream's function, counted in ``stats()["fallback_reasons"]``.
The C objects call the next layer (often another C object: the runtime
wrapper, CompiledFunction, another of these) by vectorcall.
"""

from __future__ import annotations

import functools
import inspect

from . import _state

_KW = "KEYWORD_ONLY"
_PK = "POSITIONAL_OR_KEYWORD"
# CompilerWrapper.post_compile / InductorWrapper.post_compile, on every verified release
_SHAPE = (("self", _PK), ("compiled_fn", _PK), ("aot_config", _PK), ("runtime_metadata", _KW))
# what functools.update_wrapper assigns, and Python 3.12's addition
_IDENTITY = ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__",
             "__type_params__")
SOURCE_CAPTURE = "runtime-wrapper source is being captured (aot_autograd.compile_to_python)"


class Unsupported(Exception):
    """The wrapper is not the verified shape: upstream's function runs."""


def _shape(fn) -> tuple:
    return tuple((p.name, p.kind.name) for p in inspect.signature(fn).parameters.values())


def _generated(fn, name: str, names: tuple[str, ...]) -> dict:
    """The globals that upstream's generated function ``name`` reads."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name != name:
        raise Unsupported(f"upstream returned {getattr(code, 'co_name', type(fn).__name__)}, "
                          f"not the generated {name}")
    g = fn.__globals__
    missing = [n for n in names if n not in g]
    if missing:
        raise Unsupported(f"{name} does not bind {missing}")
    return {n: g[n] for n in names}


def _cells(fn, name: str, freevars: tuple[str, ...]) -> dict:
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name != name or code.co_freevars != freevars:
        raise Unsupported(f"upstream's function is not the verified {name} closure")
    return dict(zip(freevars, fn.__closure__))


def _indices(values, what: str) -> tuple:
    out = tuple(values)
    if not all(type(v) is int and v >= 0 for v in out):
        raise Unsupported(f"{what} is not a list of non-negative ints")
    return out


def _tensor_hash_is_id() -> bool:
    """Tensor.__hash__ is upstream's ``return id(self)`` and Parameter's is it."""
    import torch

    h = torch.Tensor.__dict__.get("__hash__")
    code = getattr(h, "__code__", None)
    return (
        code is not None
        and code.co_names == ("id",)
        and code.co_argcount == 1
        and torch.nn.Parameter.__hash__ is h
    )


def _dedupe(wrapper, fn, compiled_fn, aot_config, meta):
    cells = _debugged_cells(fn)
    inner = cells["wrapped_compiled_fn"].cell_contents
    target = _generated(inner, "inner_fn", ("compiled_fn",))["compiled_fn"]
    return _dedupe_wrapper(wrapper, fn, cells, target)


def _dedupe_closure(wrapper, fn, compiled_fn, aot_config, meta):
    # 2.11: wrapped_compiled_fn is a closure, `deduped_args =
    # self.remove_dupe_args(args)` (the kept items, in order, for a list of
    # the compiled length: what DedupeWrapper takes), args.clear(), the call
    cells = _debugged_cells(fn)
    inner = _cells(cells["wrapped_compiled_fn"].cell_contents, "wrapped_compiled_fn",
                   ("compiled_fn", "self"))
    if inner["self"].cell_contents is not wrapper:
        raise Unsupported("wrapped_compiled_fn closes over another wrapper")
    return _dedupe_wrapper(wrapper, fn, cells, inner["compiled_fn"].cell_contents)


def _debugged_cells(fn):
    cells = _cells(fn, "debugged_compiled_fn", fn.__code__.co_freevars)
    if set(cells) != {"self", "aot_config", "wrapped_compiled_fn"}:
        raise Unsupported("debugged_compiled_fn is not the verified closure")
    return cells


def _dedupe_wrapper(wrapper, fn, cells, target):
    from . import _C

    if cells["self"].cell_contents is not wrapper:
        raise Unsupported("debugged_compiled_fn closes over another wrapper")
    keep = [bool(k) for k in wrapper.keep_arg_mask]
    add = _indices(wrapper.add_dupe_map, "add_dupe_map")
    kept = tuple(i for i, k in enumerate(keep) if k)
    if len(add) != len(keep) or any(j >= len(kept) for j in add):
        # upstream raises IndexError (or checks nothing) on every call
        raise Unsupported("add_dupe_map does not index the kept arguments")
    if not _tensor_hash_is_id():
        raise Unsupported("Tensor.__hash__ is not upstream's id(self)")
    src = tuple(kept[j] for j in add)
    return _C.DedupeWrapper(fn, target, kept, src)


def _effect_tokens(wrapper, fn, compiled_fn, aot_config, meta):
    from . import _C

    g = _generated(fn, "_effect_tokens_wrapper", ("_compiled_fn_",))
    return _C.EffectTokensWrapper(fn, g["_compiled_fn_"], len(meta.tokens))


def _effect_tokens_closure(wrapper, fn, compiled_fn, aot_config, meta):
    """2.12's ``inner_fn``, around every compiled function: with tokens it is
    the generated function's program, without it only passes the call on."""
    from . import _C

    cells = _cells(fn, "inner_fn", ("compiled_fn", "num_tokens"))
    n = cells["num_tokens"].cell_contents
    if type(n) is not int or n != len(meta.tokens):
        raise Unsupported("inner_fn's num_tokens is not len(runtime_metadata.tokens)")
    target = cells["compiled_fn"].cell_contents
    if n == 0:
        return _C.ForwardingWrapper(fn, target)
    return _C.EffectTokensWrapper(fn, target, n)


def _synthetic_base(wrapper, fn, compiled_fn, aot_config, meta):
    from . import _C

    g = _generated(fn, "_synthetic_base_wrapper", ("torch", "_compiled_fn_"))
    groups = wrapper.base_groups
    order = sorted(groups)
    if order != list(range(len(order))):
        # upstream's `_bases[k] = ...` would raise IndexError on every call
        raise Unsupported("base_groups keys are not 0..n-1")
    return _C.SyntheticBaseWrapper(
        fn,
        g["_compiled_fn_"],
        g["torch"],
        tuple(_indices(groups[k], "a base group") for k in order),
        _indices(wrapper.other_arg_indices, "other_arg_indices"),
        _indices(wrapper.aliased_arg_idx_with_metadata_mutations,
                 "aliased_arg_idx_with_metadata_mutations"),
    )


def _synthetic_base_closure(wrapper, fn, compiled_fn, aot_config, meta):
    # 2.12's wrapped_compiled_fn runs merge_view_inputs on every call (2.13
    # generates the base groups' program once): not mirrored
    raise Unsupported(f"AOTSyntheticBaseWrapper.post_compile returns a closure on torch "
                      f"{_state.release().name} (merge_view_inputs per call, not mirrored)")


def _unpack2(value):
    """``seed, offset = value``, for a state that is not a pair: Python's own
    unpacking and errors."""
    seed, offset = value
    return seed, offset


def _rng(wrapper, fn, compiled_fn, aot_config, meta):
    from . import _C

    g = _generated(fn, "_functionalized_rng_wrapper",
                   ("_compiled_fn_", "_get_rng_state_", "_set_offset_"))
    k = meta.num_forward_returns
    if type(k) is not int or k < 0:
        raise Unsupported("num_forward_returns is not a non-negative int")
    return _C.RngWrapper(fn, g["_compiled_fn_"], g["_get_rng_state_"], g["_set_offset_"],
                         _unpack2, k, bool(wrapper.return_new_outs))


def _rng_closure(wrapper, fn, compiled_fn, aot_config, meta):
    """2.12's ``wrapper``, around every compiled function: without RNG
    functionalization it only passes the call on."""
    from . import _C

    cells = _cells(fn, "wrapper", ("compiled_fn", "runtime_metadata", "self"))
    if cells["runtime_metadata"].cell_contents is not meta or cells["self"].cell_contents \
            is not wrapper:
        raise Unsupported("wrapper closes over another metadata or wrapper")
    if meta.is_rng_op_functionalized:
        # CUDA only: CUDARngStateHelper per call; never run here to compare
        raise Unsupported(f"FunctionalizedRngRuntimeWrapper.post_compile returns a closure on "
                          f"torch {_state.release().name} (functionalized RNG, not mirrored)")
    return _C.ForwardingWrapper(fn, cells["compiled_fn"].cell_contents)


def _fakified_out(wrapper, fn, compiled_fn, aot_config, meta):
    from . import _C

    cells = _cells(fn, "wrapper", ("compiled_fn", "fakified_out"))
    return _C.FakifiedOutWrapper(fn, cells["compiled_fn"], cells["fakified_out"])


def _debug_assert(wrapper, fn, compiled_fn, aot_config, meta):
    from . import _C

    g = _generated(fn, "inner_fn", ("compiled_fn", "Tensor"))
    return _C.DebugAssertWrapper(fn, g["compiled_fn"], g["Tensor"],
                                 _debug_checks(wrapper, aot_config))


def _debug_assert_closure(wrapper, fn, compiled_fn, aot_config, meta):
    # 2.11: debug_compiled_function, a closure over (aot_config, compiled_fn,
    # self) checking every argument against self.flat_requires_grad[i]
    from . import _C

    cells = _cells(fn, "debug_compiled_function", ("aot_config", "compiled_fn", "self"))
    if cells["self"].cell_contents is not wrapper or cells["aot_config"].cell_contents is not aot_config:
        raise Unsupported("debug_compiled_function closes over another wrapper")
    tensor = _generated(fn, "debug_compiled_function", ("Tensor",))["Tensor"]
    return _C.DebugAssertWrapper(fn, cells["compiled_fn"].cell_contents, tensor,
                                 _debug_checks(wrapper, aot_config),
                                 n_args=len(wrapper.flat_requires_grad))


def _debug_checks(wrapper, aot_config) -> tuple:
    rw = _runtime_wrappers()
    checks = []
    for i, can_require_grad in enumerate(wrapper.flat_requires_grad):
        # the messages upstream's post_compile formats
        if can_require_grad is None:
            checks.append((i, True, f"expected non-Tensor for arg {i}, got Tensor"))
        elif not can_require_grad:
            checks.append((i, False, rw.format_guard_bug_msg(
                aot_config, f"{rw.describe_input(i, aot_config)} would not require grad")))
    return tuple(checks)


def _runtime_wrappers():
    import torch._functorch._aot_autograd.runtime_wrappers as rw

    return rw


# (class, what stats() calls it, builder, builder where the release's
# post_compile returns a reference closure: Release.closure_compiler_wrappers)
BUILDERS = (
    ("AOTDedupeWrapper", "dedupe", _dedupe, _dedupe_closure),
    ("EffectTokensWrapper", "effect tokens", _effect_tokens, _effect_tokens_closure),
    ("AOTSyntheticBaseWrapper", "synthetic base", _synthetic_base, _synthetic_base_closure),
    ("FunctionalizedRngRuntimeWrapper", "functionalized RNG", _rng, _rng_closure),
    ("FakifiedOutWrapper", "fakified out", _fakified_out, None),
    ("DebugAssertWrapper", "debug assert", _debug_assert, _debug_assert_closure),
)


def _identity(ours, fn):
    """``fn``'s identity on ``ours``: what update_wrapper / wraps and the
    ``_boxed_call = True`` gave upstream's function."""
    for name in _IDENTITY:
        try:
            value = getattr(fn, name)
        except AttributeError:
            continue
        setattr(ours, name, value)
    ours.__dict__.update(fn.__dict__)
    return ours


def build(what: str, builder, wrapper, fn, compiled_fn, aot_config, runtime_metadata):
    """The C object for upstream's ``fn``, or ``fn`` with a counted reason."""
    reason = _state.closed()
    if reason is None and _state.source_capture_active():
        # the capture composes upstream's generated functions by identity
        reason = SOURCE_CAPTURE
    if reason is None:
        try:
            ours = builder(wrapper, fn, compiled_fn, aot_config, runtime_metadata)
            ours = _identity(ours, fn)
        except Unsupported as e:
            reason = str(e)
        except Exception as e:
            reason = _state.internal_error(e)
        else:
            _state.count_built("wrappers")
            return ours
    _state.count_fallback(f"{what} wrapper: {reason}")
    return fn


def _ours(upstream, what: str, builder):
    @functools.wraps(upstream)
    def post_compile(self, compiled_fn, aot_config, *, runtime_metadata):
        fn = upstream(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
        if fn is compiled_fn or not _state.is_enabled():
            return fn  # nothing generated (the wrapper is not needed), or the C path off
        return build(what, builder, self, fn, compiled_fn, aot_config, runtime_metadata)

    return post_compile


def install(rw) -> list:
    """Replace each class's ``post_compile`` where it has the verified shape;
    returns the ``_state.Replaced`` records."""
    replaced = []
    release = _state.release()
    for cls_name, what, builder, closure_builder in BUILDERS:
        if cls_name in release.closure_compiler_wrappers:
            builder = closure_builder
        cls = rw.__dict__.get(cls_name)
        upstream = getattr(cls, "__dict__", {}).get("post_compile")
        if upstream is None or not inspect.isfunction(upstream) or _shape(upstream) != _SHAPE:
            _state.count_fallback(
                f"{what} wrapper: {cls_name}.post_compile is not the verified one")
            continue
        try:
            replaced.append(_state.replace(cls, "post_compile", _ours(upstream, what, builder)))
        except Exception as e:
            _state.count_fallback(f"{what} wrapper: {_state.internal_error(e)}")
    return replaced
