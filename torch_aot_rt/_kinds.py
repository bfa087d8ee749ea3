"""The small ints a runtime-wrapper plan is made of: how each mutated input is
written back, and how each output is produced. Keep in sync with csrc/plan.h."""

# mutation kinds (_apply_input_mutations) and their flags
MUT_SKIP, MUT_SET, MUT_METADATA, MUT_DATA = 0, 1, 2, 3
MUT_AS_STRIDED_FIRST, MUT_LEAF, MUT_STREAM_ERROR = 1, 2, 4
# output kinds (_replay_output_aliases' handlers)
OUT_PASS, OUT_IS_INPUT, OUT_ALIAS_OF_INPUT, OUT_ALIAS_OF_INTERMEDIATE = 0, 1, 2, 3
