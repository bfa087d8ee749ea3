"""``AOTDispatchSubclassWrapper``'s per-call wrapper in C (``_C.SubclassWrapper``,
csrc/aot/wrappers/subclass_wrapper.c).

Upstream's ``AOTDispatchSubclassWrapper.post_compile`` (runtime_wrappers.py)
generates, per graph, a Python function (subclass_codegen.py,
``codegen_subclass_wrapper``) that unwraps tensor-subclass inputs into their
inner tensors and symbolic sizes, calls the compiled graph, and rebuilds the
subclass outputs with ``__tensor_unflatten__``. Ours walks the same metadata
(``runtime_metadata.subclass_inp_meta`` / ``subclass_fw_graph_out_meta``: each
a ``PlainTensorMeta`` or a ``SubclassCreationMeta`` with its attrs) in the same
order as the codegen functions named below, and writes, instead of source, a
program of small instructions over numbered registers (the generated
function's locals) that the C wrapper validates once and runs per call.

What the releases do differently is the release's
``subclass_outputs_by_cursor`` (2.14 on: outputs read with a running index,
optional SymInt outputs, count assertions, plain-tensor SymInt placeholders,
outer size/stride read from an inner attribute, activations counted from the
end) and ``subclass_act_inputs`` (the metadata field naming
AsyncCollectiveTensor inputs, which keep upstream's wrapper).

Whatever the program cannot express keeps upstream's generated wrapper,
counted in ``stats()`` with the reason; an exception while building is such a
fallback too, never an error in the user's compile.
"""

from __future__ import annotations

import inspect
import sys

from . import _state
from ._kinds import (
    SC_APPEND,
    SC_APPEND_ATTR,
    SC_ARG,
    SC_DICT,
    SC_GETATTR,
    SC_LOAD_CHECKED,
    SC_NONE,
    SC_OPT_SKIP,
    SC_OUT,
    SC_SIZE,
    SC_STRIDE,
    SC_TAIL_FROM,
    SC_TAIL_FROM_END,
    SC_TAIL_NONE,
    SC_TUPLE,
    SC_UNFLATTEN,
)
from ._plan import Unsupported, check_available

ARTIFACT = "subclass_wrapper"
# the generated function's own identity, before update_wrapper(fn, compiled_fn)
_DEFAULTS = (("__name__", "inner_fn"), ("__qualname__", "inner_fn"), ("__module__", None),
             ("__doc__", None))
_POST_COMPILE_SHAPE = (
    ("self", "POSITIONAL_OR_KEYWORD"), ("compiled_fn", "POSITIONAL_OR_KEYWORD"),
    ("aot_config", "POSITIONAL_OR_KEYWORD"), ("runtime_metadata", "KEYWORD_ONLY"),
)


class _Program:
    """Instructions ``(op, a, b, c, d, obj, obj2, idx)`` and registers."""

    def __init__(self) -> None:
        self.unwrap: list[tuple] = []
        self.wrap: list[tuple] = []
        self.n_regs = 0

    def reg(self) -> int:
        self.n_regs += 1
        return self.n_regs - 1

    @staticmethod
    def op(code, op, a=0, b=0, c=0, d=0, obj=None, obj2=None, idx=()):
        code.append((op, a, b, c, d, obj, obj2, tuple(idx)))


def _attr_name(attr) -> str:
    # _safe_attr_access formats the name into source: a str is all it takes
    if not isinstance(attr, str):
        raise Unsupported(f"subclass wrapper: attribute name {attr!r} is not a str")
    return attr


def _subclass_type(meta):
    return meta.original_subclass_type or type(meta.original_subclass)


class _Builder:
    def __init__(self, sc, schemas, by_cursor: bool) -> None:
        self.sc = sc  # torch's subclass_codegen, for its placeholder helpers
        self.Plain = schemas.PlainTensorMeta
        self.Opaque = schemas.OpaqueMeta
        self.Subclass = schemas.SubclassCreationMeta
        self.by_cursor = by_cursor
        self.p = _Program()

    # ---- inputs: _emit_input_unwrapping, _codegen_unwrap_subclass -------

    def _dims(self, var: int, placeholders, stride: bool, attr=None) -> None:
        idx = [i for i, is_sym in enumerate(placeholders) if is_sym]
        self.p.op(self.p.unwrap, SC_STRIDE if stride else SC_SIZE, var, obj=attr, idx=idx)

    def _plain_symints(self, var: int, attr: str, meta) -> None:
        # 2.14's emit_plain_tensor_symints(f"{var}.{attr}", meta): each of
        # size() and stride() only where it has a placeholder, on the
        # attribute read again
        size = tuple(getattr(meta, "size_symbol_placeholders", ()))
        stride = tuple(getattr(meta, "stride_symbol_placeholders", ()))
        if any(size):
            self._dims(var, size, False, attr)
        if any(stride):
            self._dims(var, stride, True, attr)

    def unwrap_subclass(self, meta, var: int) -> None:
        p = self.p
        for attr, attr_meta in meta.attrs.items():
            attr = _attr_name(attr)
            if isinstance(attr_meta, (self.Plain, self.Opaque)):
                p.op(p.unwrap, SC_APPEND_ATTR, b=var, obj=attr)
                if self.by_cursor and isinstance(attr_meta, self.Plain):
                    self._plain_symints(var, attr, attr_meta)
            elif isinstance(attr_meta, self.Subclass):
                inner = p.reg()
                p.op(p.unwrap, SC_GETATTR, inner, var, obj=attr)
                self.unwrap_subclass(attr_meta, inner)
            else:
                raise Unsupported(f"subclass wrapper: attribute meta {type(attr_meta).__name__}")
        size = self.sc._compute_placeholders(meta.outer_size)
        stride = self.sc._compute_placeholders(meta.outer_stride)
        if any(size) or any(stride):  # both calls, as the generated code makes them
            self._dims(var, size, False)
            self._dims(var, stride, True)

    def unwrap_inputs(self, inp_metas, frozen) -> None:
        p = self.p
        for i, meta in enumerate(inp_metas):
            if isinstance(meta, self.Plain):
                p.op(p.unwrap, SC_ARG, i)
            elif i in frozen:
                p.op(p.unwrap, SC_NONE)
            elif isinstance(meta, self.Subclass):
                var = p.reg()
                p.op(p.unwrap, SC_LOAD_CHECKED, var, i, obj=_subclass_type(meta))
                self.unwrap_subclass(meta, var)
            else:
                raise Unsupported(f"subclass wrapper: input meta {type(meta).__name__}")

    # ---- outputs, 2.13: fixed indices (_codegen_wrap_subclass, _emit_output_wrapping)

    def _out(self, index: int) -> int:
        r = self.p.reg()
        self.p.op(self.p.wrap, SC_OUT, r, index)
        return r

    def _tuple(self, outer, placeholders, read) -> int:
        p = self.p
        template, regs = [], []
        for val, is_sym in zip(outer, placeholders):
            if is_sym:
                template.append(None)
                regs.append(read())
            else:
                template.append(self.sc._concrete_value(val))
                regs.append(-1)
        r = p.reg()
        p.op(p.wrap, SC_TUPLE, r, obj=tuple(template), idx=regs)
        return r

    def _unflatten(self, meta, inner: int, size, stride) -> int:
        r = self.p.reg()
        (size_reg, size_call), (stride_reg, stride_call) = size, stride
        self.p.op(self.p.wrap, SC_UNFLATTEN, r, inner, size_reg, stride_reg,
                  obj=_subclass_type(meta), obj2=meta.meta,
                  idx=(int(size_call), int(stride_call)))
        return r

    def _dict(self, entries) -> int:
        r = self.p.reg()
        self.p.op(self.p.wrap, SC_DICT, r, obj=tuple(a for a, _ in entries),
                  idx=[v for _, v in entries])
        return r

    def wrap_subclass_fixed(self, meta, next_idx: list) -> int:
        def read():
            next_idx[0] += 1
            return self._out(next_idx[0] - 1)

        entries = []
        for attr, attr_meta in meta.attrs.items():
            attr = _attr_name(attr)
            if isinstance(attr_meta, (self.Plain, self.Opaque)):
                entries.append((attr, read()))
            elif isinstance(attr_meta, self.Subclass):
                entries.append((attr, self.wrap_subclass_fixed(attr_meta, next_idx)))
            else:
                raise Unsupported(f"subclass wrapper: attribute meta {type(attr_meta).__name__}")
        inner = self._dict(entries)
        size = self._tuple(meta.outer_size, self.sc._compute_placeholders(meta.outer_size), read)
        stride = self._tuple(meta.outer_stride, self.sc._compute_placeholders(meta.outer_stride),
                             read)
        return self._unflatten(meta, inner, (size, False), (stride, False))

    def wrap_outputs_fixed(self, out_metas):
        """(result registers, num_args_tallied)"""
        next_idx = [0]
        results, tallied = [], 0
        for meta in out_metas:
            if isinstance(meta, self.Plain):
                results.append(self._out(meta.unwrapped_idx))
                tallied += 1
                next_idx[0] = max(next_idx[0], meta.unwrapped_idx + 1)
            elif isinstance(meta, self.Subclass):
                results.append(self.wrap_subclass_fixed(meta, next_idx))
                tallied += meta.arg_count
            else:
                raise Unsupported(f"subclass wrapper: output meta {type(meta).__name__}")
        return results, tallied

    # ---- outputs, 2.14: a running index with optional SymInt outputs ------

    def _required(self) -> int:
        self.remaining[0] -= 1
        self.remaining[1] -= 1
        return self._out(-1)

    def _optional_skip(self) -> None:
        # _emit_optional_symint_skip: the counts that must remain after it
        later_min, later_max = self.remaining[0], self.remaining[1] - 1
        self.p.op(self.p.wrap, SC_OPT_SKIP, later_min, later_max)
        self.remaining[1] -= 1

    def _optional_plain_skips(self, meta) -> None:
        for is_sym in tuple(meta.size_symbol_placeholders) + tuple(meta.stride_symbol_placeholders):
            if is_sym:
                self._optional_skip()

    def wrap_subclass_cursor(self, meta) -> int:
        entries = []
        for attr, attr_meta in meta.attrs.items():
            attr = _attr_name(attr)
            if isinstance(attr_meta, self.Plain):
                r = self._required()
                self._optional_plain_skips(attr_meta)
            elif isinstance(attr_meta, self.Opaque):
                r = self._required()
            elif isinstance(attr_meta, self.Subclass):
                r = self.wrap_subclass_cursor(attr_meta)
            else:
                raise Unsupported(f"subclass wrapper: attribute meta {type(attr_meta).__name__}")
            entries.append((attr, r))
        inner = self._dict(entries)
        regs = dict(entries)

        def side(outer, from_attr):
            placeholders = self.sc._compute_placeholders(outer)
            if from_attr is not None:
                for is_sym in placeholders:
                    if is_sym:
                        self._optional_skip()
                return regs[from_attr], True
            return self._tuple(outer, placeholders, self._required), False

        size = side(meta.outer_size, meta.outer_size_from_attr)
        stride = side(meta.outer_stride, meta.outer_stride_from_attr)
        return self._unflatten(meta, inner, size, stride)

    def wrap_outputs_cursor(self, out_metas):
        """(result registers, (min, max) wrapped outputs)"""
        count = self.sc._count_output_args
        lo = sum(count(m, include_subclass_symints=False) for m in out_metas)
        hi = sum(count(m, include_subclass_symints=True) for m in out_metas)
        self.remaining = [lo, hi]
        results = []
        for meta in out_metas:
            if isinstance(meta, self.Plain):
                results.append(self._required())
                self._optional_plain_skips(meta)
            elif isinstance(meta, self.Subclass):
                results.append(self.wrap_subclass_cursor(meta))
            else:
                raise Unsupported(f"subclass wrapper: output meta {type(meta).__name__}")
        if self.remaining != [0, 0]:  # upstream raises at build: its wrapper then
            raise Unsupported("subclass wrapper: output counts do not balance")
        return results, (lo, hi)


def make_plan(compiled_fn, num_fw_outs_saved_for_bw, frozen, runtime_metadata, release) -> dict:
    """Keyword arguments for ``_C.SubclassWrapper``: ``_codegen_subclass_wrapper_source``."""
    import torch._functorch._aot_autograd.schemas as schemas
    import torch._functorch._aot_autograd.subclass_codegen as sc

    by_cursor = release.subclass_outputs_by_cursor
    b = _Builder(sc, schemas, by_cursor)
    inp_metas = list(runtime_metadata.subclass_inp_meta)
    out_metas = list(runtime_metadata.subclass_fw_graph_out_meta)
    b.unwrap_inputs(inp_metas, frozen)
    count_check = None
    if by_cursor:
        results, (lo, hi) = b.wrap_outputs_cursor(out_metas)
        count_check = (lo, hi)
        saved = num_fw_outs_saved_for_bw or 0
        tail, tail_n = (
            (SC_TAIL_NONE, 0) if num_fw_outs_saved_for_bw is None
            else (SC_TAIL_FROM_END, num_fw_outs_saved_for_bw)
        )
    else:
        results, tallied = b.wrap_outputs_fixed(out_metas)
        saved = 0
        tail, tail_n = (
            (SC_TAIL_NONE, 0) if num_fw_outs_saved_for_bw is None else (SC_TAIL_FROM, tallied)
        )
    return dict(
        n_inputs=len(inp_metas),
        n_regs=b.p.n_regs,
        unwrap=tuple(b.p.unwrap),
        wrap=tuple(b.p.wrap),
        results=tuple(results),
        cursor=by_cursor,
        saved=saved,
        count_check=count_check,
        final_check=by_cursor,
        tail=tail,
        tail_n=tail_n,
        # the generated source is compiled at the interpreter's optimization
        # level: under -O its asserts are not there
        asserts=not sys.flags.optimize,
        wrap_only=False,
    )


def make_wrap_plan(out_metas, release) -> dict:
    """Keyword arguments for the wrap-only ``_C.SubclassWrapper`` standing for
    ``codegen_backward_subclass_fns``' ``wrap_fn(unwrapped_outs)`` (the
    backward's grads wrapped into subclasses: ``_codegen_subclass_wrap_source``,
    the output half of the forward's wrapper without activations)."""
    import torch._functorch._aot_autograd.schemas as schemas
    import torch._functorch._aot_autograd.subclass_codegen as sc

    if out_metas is None:
        raise Unsupported("CompiledFunction: subclass grad_input_metas is None")
    by_cursor = release.subclass_outputs_by_cursor
    b = _Builder(sc, schemas, by_cursor)
    out_metas = list(out_metas)
    if by_cursor:
        results, count_check = b.wrap_outputs_cursor(out_metas)
    else:
        results, _ = b.wrap_outputs_fixed(out_metas)
        count_check = None
    return dict(
        n_inputs=0, n_regs=b.p.n_regs, unwrap=(), wrap=tuple(b.p.wrap), results=tuple(results),
        cursor=by_cursor, saved=0, count_check=count_check, final_check=by_cursor,
        tail=SC_TAIL_NONE, tail_n=0, asserts=not sys.flags.optimize, wrap_only=True,
    )


def grads_wrapper(out_metas, release):
    """The C ``wrap_fn`` for a backward (see :func:`make_wrap_plan`)."""
    from . import _C

    return _C.SubclassWrapper(None, **make_wrap_plan(out_metas, release))


def describe(plan) -> str:
    """What the C wrapper does per call, for TORCH_TRACE (in upstream's
    ``subclass_wrapper`` artifact's place)."""
    from ._trace import HEADER

    lines = [HEADER.replace("runtime wrapper", "subclass wrapper").replace(
        "RuntimeWrapper", "SubclassWrapper"), f"# artifact: {ARTIFACT}"]
    lines.append(f"unwrap {plan['n_inputs']} inputs:")
    lines += [f"  {_op_text(i)}" for i in plan["unwrap"]]
    lines.append("call the compiled graph on the flat list; then:")
    lines += [f"  {_op_text(i)}" for i in plan["wrap"]]
    lines.append(f"return registers {list(plan['results'])}"
                 + ("" if plan["tail"] == SC_TAIL_NONE else " + the activations saved for backward"))
    return "\n".join(lines) + "\n"


_OP_NAMES = {
    SC_ARG: "append args[{a}]", SC_NONE: "append None (frozen)",
    SC_LOAD_CHECKED: "r{a} = args[{b}]; check type(r{a}) is {obj}",
    SC_GETATTR: "r{a} = r{b}.{obj}", SC_APPEND_ATTR: "append r{b}.{obj}",
    SC_APPEND: "append r{a}", SC_SIZE: "append sizes {idx} of r{a}{attr}",
    SC_STRIDE: "append strides {idx} of r{a}{attr}", SC_OUT: "r{a} = outs[{where}]",
    SC_OPT_SKIP: "skip an optional SymInt output (then {a}..{b} remain)",
    SC_DICT: "r{a} = inner tensors {obj}", SC_TUPLE: "r{a} = sizes {obj}",
    SC_UNFLATTEN: "r{a} = {obj}.__tensor_unflatten__(r{b}, meta, r{c}{size}, r{d}{stride})",
}


def _op_text(instr) -> str:
    op, a, b, c, d, obj, _obj2, idx = instr
    name = getattr(obj, "__qualname__", obj)
    if op == SC_TUPLE:
        name = "(" + ", ".join(repr(v) if r < 0 else f"r{r}" for v, r in zip(obj, idx)) + \
            ("," if len(idx) == 1 else "") + ")"
    return _OP_NAMES[op].format(
        a=a, b=b, c=c, d=d, obj=name, idx=list(idx),
        attr=f".{obj}" if isinstance(obj, str) else "",
        where="next" if b < 0 else b,
        size=".size()" if op == SC_UNFLATTEN and idx[0] else "",
        stride=".stride()" if op == SC_UNFLATTEN and idx[1] else "",
    )


def _c_wrapper(compiled_fn, plan):
    import functools

    from . import _C

    wrapper = _C.SubclassWrapper(compiled_fn, **plan)
    # upstream: functools.update_wrapper(inner_fn, compiled_fn) on the
    # generated function, then inner_fn._boxed_call = True
    for name, value in _DEFAULTS:
        setattr(wrapper, name, value)
    wrapper.__annotations__ = {}
    functools.update_wrapper(wrapper, compiled_fn)
    wrapper._boxed_call = True
    return wrapper


def build(upstream, wrapper_self, compiled_fn, aot_config, runtime_metadata):
    """Our ``AOTDispatchSubclassWrapper.post_compile``."""
    from . import _trace

    release = _state.release()
    act = getattr(runtime_metadata, release.subclass_act_inputs, None)
    if wrapper_self.maybe_subclass_meta is None and not act:
        return upstream(wrapper_self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
    try:
        check_available()
        if act:
            raise Unsupported("subclass wrapper: AsyncCollectiveTensor inputs")
        frozen = wrapper_self._get_frozen_inp_indices()
        plan = make_plan(compiled_fn, wrapper_self.num_fw_outs_saved_for_bw, frozen,
                         runtime_metadata, release)
        wrapper = _c_wrapper(compiled_fn, plan)
    except Unsupported as e:
        reason = str(e)
    except Exception as e:
        reason = "subclass wrapper: " + _state.internal_error(e)
    else:
        _trace.log_text(ARTIFACT, lambda: describe(plan))
        _state.count_built("subclass_wrappers")
        return wrapper
    _state.count_fallback(reason)
    return upstream(wrapper_self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)


def install(rw):
    """Put our ``post_compile`` on ``AOTDispatchSubclassWrapper``; returns the
    ``_state.Replaced`` record, or None where the class is not the verified one
    (counted). Where the release's wrapper is not mirrored, ours only counts
    each compile that reaches upstream's."""
    import functools

    cls = rw.__dict__.get("AOTDispatchSubclassWrapper")
    upstream = getattr(cls, "__dict__", {}).get("post_compile")
    if not _state.release().subclass_wrapper_mirrored and inspect.isfunction(upstream):
        # upstream's runs; each compile that reaches it is counted
        reason = f"subclass wrapper: not mirrored for torch {_state.release().name}"

        @functools.wraps(upstream)
        def counted(self, compiled_fn, aot_config, *, runtime_metadata):
            fn = upstream(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
            if fn is not compiled_fn and _state.is_enabled():
                _state.count_fallback(reason)
            return fn

        return _state.replace(cls, "post_compile", counted)
    if upstream is None or not inspect.isfunction(upstream):
        _state.count_fallback("subclass wrapper: AOTDispatchSubclassWrapper.post_compile "
                              "is not the verified one")
        return None
    shape = tuple((p.name, p.kind.name) for p in inspect.signature(upstream).parameters.values())
    if shape != _POST_COMPILE_SHAPE or not callable(getattr(cls, "_get_frozen_inp_indices", None)):
        _state.count_fallback(f"subclass wrapper: AOTDispatchSubclassWrapper.post_compile"
                              f"{inspect.signature(upstream)} is not the verified one")
        return None
    # what the release entry says of the generated wrapper, checked
    import torch._functorch._aot_autograd.schemas as schemas
    import torch._functorch._aot_autograd.subclass_codegen as sc

    release = _state.release()
    fields = getattr(schemas.ViewAndMutationMeta, "__dataclass_fields__", {})
    if (hasattr(sc, "_count_output_args") != release.subclass_outputs_by_cursor
            or release.subclass_act_inputs not in fields):
        _state.count_fallback(f"subclass wrapper: subclass_codegen is not torch "
                              f"{release.name}'s")
        return None

    @functools.wraps(upstream)
    def post_compile(self, compiled_fn, aot_config, *, runtime_metadata):
        if not _state.is_enabled():
            return upstream(self, compiled_fn, aot_config, runtime_metadata=runtime_metadata)
        return build(upstream, self, compiled_fn, aot_config, runtime_metadata)

    return _state.replace(cls, "post_compile", post_compile)
