"""The small ints a runtime-wrapper plan and a subclass-wrapper program are
made of, as the C core defines them (csrc/plan.h's enums, csrc/aot/
subclass_wrapper.c's): how each mutated input is written back, how each
output is produced, the subclass wrapper's instructions and how it returns
the activations saved for backward."""

from ._C import (  # noqa: F401
    MUT_AS_STRIDED_FIRST, MUT_DATA, MUT_LEAF, MUT_LEAF_STREAM_ERROR, MUT_METADATA, MUT_SET,
    MUT_SKIP, MUT_STREAM_ERROR, OUT_ALIAS_OF_INPUT, OUT_ALIAS_OF_INTERMEDIATE, OUT_IS_INPUT,
    OUT_PASS, SC_APPEND, SC_APPEND_ATTR, SC_ARG, SC_DICT, SC_GETATTR, SC_LOAD_CHECKED, SC_NONE,
    SC_OPT_SKIP, SC_OUT, SC_SIZE, SC_STRIDE, SC_TAIL_FROM, SC_TAIL_FROM_END, SC_TAIL_NONE,
    SC_TUPLE, SC_UNFLATTEN,
)
