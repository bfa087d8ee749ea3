/* epilogue: what the runtime wrapper does with the compiled function's
 * outputs (upstream's _RuntimeForwardEpilogue.finalize and the code
 * _create_runtime_wrapper generates for it). */
#ifndef TORCH_AOT_RT_EPILOGUE_H
#define TORCH_AOT_RT_EPILOGUE_H

#include "plan.h"
#include "state.h"

/* all_outs: the normalised list from the compiled function. captured: the
 * inputs kept past the call, by slot. Returns the user-visible outputs. */
PyObject *rt_finalize(rt_state *st, const rt_plan *plan, PyObject *const *captured,
                      PyObject *all_outs);

#endif
