"""Structured-trace artifacts (``TORCH_TRACE``, tlparse) for the C runtime wrapper.

Upstream's ``_create_runtime_wrapper`` generates Python source named
``output_alias_wrapper`` when the graph has aliased outputs, ``mutation_epilogue``
when it has mutated runtime inputs, then ``runtime_wrapper_orchestration``. The C
wrapper generates no source, so where upstream logs those it logs, under the same
names, a description of its plan: what the C wrapper does for that graph on
each call. How upstream logs them is the release's
(``Release.aggregates_runtime_wrapper_trace``):

- 2.13, 2.14: each source is its own ``trace_structured("artifact")`` entry,
  named after it;
- 2.15: codegen appends ``(name, source)`` to the thread's trace sink
  (``codegen._current_trace_sink()``, set by ``aggregate_runtime_wrapper_sources``
  around a compile or a cache hit), which logs ONE artifact,
  ``aot_autograd_runtime_wrappers``, of ``# <name>\n<source>`` blocks in codegen
  order when the scope ends; outside a scope, each source is such an artifact
  alone (``codegen._trace_runtime_wrapper_sources``). Our descriptions go to the
  same sink, or through the same function, in upstream's place.

Either way the text is built only when the artifact is logged with structured
tracing on (a 2.15 sink holds a :class:`PlanText`, formatted then): otherwise
nothing here is built.
"""

from __future__ import annotations

from . import _state
from ._kinds import (
    MUT_AS_STRIDED_FIRST,
    MUT_DATA,
    MUT_LEAF,
    MUT_LEAF_STREAM_ERROR,
    MUT_METADATA,
    MUT_SET,
    MUT_SKIP,
    MUT_STREAM_ERROR,
    OUT_ALIAS_OF_INPUT,
    OUT_ALIAS_OF_INTERMEDIATE,
    OUT_IS_INPUT,
    OUT_PASS,
)

HEADER = "# torch_aot_rt: C runtime wrapper plan (torch_aot_rt._C.RuntimeWrapper), not Python source"


def _mutation_lines(plan) -> list[str]:
    capture = plan["capture"]
    lines = []
    for i, (slot, kind, flags) in enumerate(plan["mutations"]):
        inp = f"input {capture[slot]}"
        if kind == MUT_SKIP:
            what = "no mutation to apply"
        elif kind == MUT_SET:
            what = f"{inp}.set_(updated[{i}])  (storage changed)"
        elif kind == MUT_METADATA:
            what = f"{inp}.as_strided_(updated[{i}]) with its size, stride, storage offset"
        elif kind == MUT_DATA:
            steps = []
            if flags & MUT_AS_STRIDED_FIRST:
                steps.append("as_strided_ to updated's metadata")
            if flags & MUT_STREAM_ERROR:
                steps.append("RuntimeError: mutation on an input with a user-specified stream")
            elif flags & MUT_LEAF_STREAM_ERROR:
                steps.append(f"if it requires grad: {inp}.detach().copy_(updated[{i}]); "
                             "else RuntimeError: mutation on an input with a user-specified "
                             "stream  (leaf)")
            elif flags & MUT_LEAF:
                steps.append(f"under no_grad: {inp}.copy_(updated[{i}])  (leaf)")
            else:
                steps.append(f"{inp}.copy_(updated[{i}])")
            what = "; ".join(steps)
        else:  # pragma: no cover - plan.c rejects other kinds
            what = f"kind {kind}"
        lines.append(f"  mutation {i}: {what}")
    return lines


def _output_lines(plan) -> list[str]:
    outputs = plan["outputs"]
    if outputs is None:
        return ["  outputs: returned as the graph returned them (no aliased outputs)"]
    capture = plan["capture"]
    lines = []
    for i, (kind, base, unwrap_base, requires_grad, replay) in enumerate(outputs):
        how = (
            "replaying its view functions"
            if replay is not None
            else "its autograd view function, else as_strided"
        )
        if kind == OUT_PASS:
            what = "as returned"
        elif kind == OUT_IS_INPUT:
            what = f"input {capture[base]} itself"
        elif kind == OUT_ALIAS_OF_INPUT:
            what = f"regenerated from input {capture[base]} ({how}, requires_grad={requires_grad})"
        elif kind == OUT_ALIAS_OF_INTERMEDIATE:
            src = f"output {base}" + (" (TensorAlias unwrapped)" if unwrap_base else "")
            what = f"regenerated from graph {src} ({how}, requires_grad={requires_grad})"
        else:  # pragma: no cover
            what = f"kind {kind}"
        lines.append(f"  output {i}: {what}")
    return lines


def describe(plan, artifact: str) -> str:
    """The text of ``artifact`` for ``plan`` (a ``_plan.make_plan`` dict)."""
    lines = [HEADER, f"# artifact: {artifact}"]
    if artifact == "runtime_wrapper_orchestration":
        lines.append("per call:")
        if plan["detach"]:
            lines.append(f"  detach inputs {list(plan['detach'])} (they never need gradients)")
        lines.append(f"  capture inputs {list(plan['capture'])} for the epilogue")
        if plan["bump"]:
            lines.append(f"  bump the version counters of inputs {list(plan['bump'])}")
        mode = (
            "training: grad mode on and view replay on while it runs"
            if plan["trace_joint"]
            else "inference: grad mode off while it runs"
        )
        amp = "; autocast disabled" if plan["disable_amp"] else ""
        lines.append(f"  call the compiled graph ({mode}{amp})")
        if plan["disable_saved_tensors_hooks"]:
            lines.append("  saved-tensor hooks disabled around the call")
        lines.append(f"  check it returned {plan['expected_outs']} outputs")
    if artifact in ("runtime_wrapper_orchestration", "mutation_epilogue"):
        if plan["num_mutated"]:
            lines.append(f"mutation epilogue ({plan['num_mutated']} mutated inputs):")
            lines.extend(_mutation_lines(plan))
        elif artifact == "mutation_epilogue":
            lines.append("mutation epilogue: none")
    if artifact in ("runtime_wrapper_orchestration", "output_alias_wrapper"):
        lines.append("outputs:")
        lines.extend(_output_lines(plan))
        if plan["dynamic_dims"]:
            lines.append(f"  dynamic dims marked on outputs {[i for i, _ in plan['dynamic_dims']]}")
    if artifact == "runtime_wrapper_orchestration" and plan["grad_enabled_mutation"] is not None:
        lines.append(f"  then set grad mode to {plan['grad_enabled_mutation']}")
    return "\n".join(lines) + "\n"


def artifacts(plan) -> list[str]:
    """The artifact names upstream's wrapper emits for this graph, in its order
    (``num_outputs_aliased > 0``, ``num_mutated_inp_runtime_indices > 0``)."""
    names = []
    if plan["outputs"] is not None:
        names.append("output_alias_wrapper")
    if plan["num_mutated"]:
        names.append("mutation_epilogue")
    names.append("runtime_wrapper_orchestration")
    return names


class PlanText:
    """``describe(plan, name)``, built when formatted: what a 2.15 trace sink
    holds for our plan, where upstream's holds its source (the sink's entries
    are formatted as ``f"# {name}\n{source}"`` when the artifact is logged)."""

    __slots__ = ("plan", "name")

    def __init__(self, plan, name: str) -> None:
        self.plan = plan
        self.name = name

    def __str__(self) -> str:
        return describe(self.plan, self.name)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _aggregates() -> bool:
    rel = _state.release()
    return rel is not None and rel.aggregates_runtime_wrapper_trace


def log_plan(plan) -> None:
    rel = _state.release()
    if rel is not None and not rel.runtime_wrapper_generated:
        # 2.11/2.12: the reference Python runs, nothing is generated or logged
        return
    if _aggregates():
        from torch._functorch._aot_autograd import codegen

        for name in artifacts(plan):  # as _compile_and_exec_source, per source
            entry = (name, PlanText(plan, name))
            sink = codegen._current_trace_sink()
            if sink is not None:
                sink.append(entry)
            else:
                codegen._trace_runtime_wrapper_sources((entry,))
        return

    import torch._logging

    for name in artifacts(plan):
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda name=name: {"name": name, "encoding": "string"},
            payload_fn=lambda name=name: describe(plan, name),
        )


class _LazyText:
    """Text built when formatted (a 2.15 trace sink formats its entries when
    it logs them)."""

    __slots__ = ("build",)

    def __init__(self, build) -> None:
        self.build = build

    def __str__(self) -> str:
        return self.build()

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def log_text(name: str, build) -> None:
    """Log ``build()`` as the artifact ``name``, where and how upstream's
    ``_compile_and_exec_source`` logs a generated source of that name (the
    subclass wrapper's description, in its ``subclass_wrapper`` artifact's
    place); ``build`` runs only if the artifact is logged."""
    if _aggregates():
        from torch._functorch._aot_autograd import codegen

        entry = (name, _LazyText(build))
        sink = codegen._current_trace_sink()
        if sink is not None:
            sink.append(entry)
        else:
            codegen._trace_runtime_wrapper_sources((entry,))
        return

    import torch._logging

    torch._logging.trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": "string"},
        payload_fn=build,
    )
