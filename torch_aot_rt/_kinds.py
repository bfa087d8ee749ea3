"""The small ints a runtime-wrapper plan is made of: how each mutated input is
written back, and how each output is produced. Keep in sync with csrc/plan.h."""

# mutation kinds (_apply_input_mutations) and their flags
MUT_SKIP, MUT_SET, MUT_METADATA, MUT_DATA = 0, 1, 2, 3
MUT_AS_STRIDED_FIRST, MUT_LEAF, MUT_STREAM_ERROR = 1, 2, 4
# with MUT_LEAF: a leaf that does not require grad goes through the stream check (2.11/2.12)
MUT_LEAF_STREAM_ERROR = 8
# output kinds (_replay_output_aliases' handlers)
OUT_PASS, OUT_IS_INPUT, OUT_ALIAS_OF_INPUT, OUT_ALIAS_OF_INTERMEDIATE = 0, 1, 2, 3

# the subclass wrapper's instructions (csrc/aot/subclass_wrapper.c enum sc_op)
(SC_ARG, SC_NONE, SC_LOAD_CHECKED, SC_GETATTR, SC_APPEND_ATTR, SC_APPEND, SC_SIZE,
 SC_STRIDE, SC_OUT, SC_OPT_SKIP, SC_DICT, SC_TUPLE, SC_UNFLATTEN) = range(13)
# how it returns the activations saved for backward after the outputs
SC_TAIL_NONE, SC_TAIL_FROM, SC_TAIL_FROM_END = 0, 1, 2
