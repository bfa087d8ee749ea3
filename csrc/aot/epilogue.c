/* epilogue.c: mutation epilogue and alias replay.
 *
 * Mirrors _RuntimeForwardEpilogue.finalize in runtime_wrappers.py, in the
 * shape _create_runtime_wrapper's generated code gives it: arity check,
 * _apply_input_mutations, _replay_output_aliases, dynamic dims, and
 * grad_enabled_mutation (on 2.11/2.12, the reference Python itself: the
 * plan bits updated_alias_inline_check, RT_MUT_LEAF_STREAM_ERROR and
 * dynamic_attr say where it differs). Every branch was chosen when the plan
 * was built.
 */
#include "aot/epilogue.h"

/* `with torch.no_grad(): orig.set_(u)` */
static int
set_under_no_grad(rt_state *st, PyObject *orig, PyObject *u)
{
    int prev = rt_grad_enabled(st);
    if (prev < 0 || rt_set_grad_enabled(st, 0) < 0) {
        return -1;
    }
    int ok = rt_tensor_set_(st, orig, u) == 0;
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int restored = rt_set_grad_enabled(st, prev) == 0;
    return rt_finally_end(&saved, restored) < 0 || !ok ? -1 : 0;
}

/* One mutated input: a branch of _apply_input_mutations. */
static int
apply_mutation(rt_state *st, const rt_plan *plan, const rt_mutation *m,
               PyObject *orig, PyObject *updated)
{
    switch (m->kind) {
    case RT_MUT_SKIP:
        return 0;
    case RT_MUT_SET:
    case RT_MUT_METADATA: {
        /* In training these arrive wrapped in TensorAlias, so that the
         * autograd.Function does not treat them as outputs. */
        PyObject *u = !plan->trace_joint ? Py_NewRef(updated)
                      : plan->updated_alias_inline_check
                          ? rt_unwrap_updated_input(st, updated)
                          : rt_unwrap_tensoralias(st, updated);
        if (u == NULL) {
            return -1;
        }
        /* See Note [set_() Input Mutations in AOTAutograd] upstream. */
        int rc = m->kind == RT_MUT_SET ? set_under_no_grad(st, orig, u)
                                       : rt_tensor_as_strided_like(st, orig, u);
        Py_DECREF(u);
        return rc;
    }
    case RT_MUT_DATA:
        if ((m->flags & RT_MUT_AS_STRIDED_FIRST) &&
            rt_tensor_as_strided_like(st, orig, updated) < 0) {
            return -1;
        }
        if (m->flags & RT_MUT_LEAF) {
            /* A leaf that requires grad can only have been mutated in ways
             * hidden from autograd; hide the copy too: detach().copy_ */
            int rg = rt_tensor_requires_grad(st, orig);
            if (rg < 0) {
                return -1;
            }
            if (rg) {
                return rt_tensor_copy_(st, orig, updated, 1);
            }
            /* 2.11/2.12: `if meta.is_leaf and original_inpt.requires_grad: ...
             * else:` reaches the user-stream check for this leaf too */
            if (m->flags & RT_MUT_LEAF_STREAM_ERROR) {
                PyErr_SetObject(PyExc_RuntimeError, st->aot.obj.stream_error_message);
                return -1;
            }
        }
        else if (m->flags & RT_MUT_STREAM_ERROR) {
            PyErr_SetObject(PyExc_RuntimeError, st->aot.obj.stream_error_message);
            return -1;
        }
        return rt_tensor_copy_(st, orig, updated, 0);
    }
    PyErr_SetString(PyExc_SystemError, "torch_aot_rt: bad mutation kind");
    return -1;
}

/* fw_outs[i] as a new reference. The list is the compiled function's and
 * Python code runs between reads (a view function, a subclass's methods), so read it afresh,
 * bounds-checked, each time instead of keeping borrowed items. */
static PyObject *
fw_out(PyObject *all_outs, Py_ssize_t num_mutated, Py_ssize_t i)
{
    if (num_mutated + i >= PyList_GET_SIZE(all_outs)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "torch_aot_rt: the compiled function's output list changed size");
        return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(all_outs, num_mutated + i));
}

/* Output i: the handler _replay_output_aliases runs for it. */
static PyObject *
replay_output(rt_state *st, const rt_plan *plan, Py_ssize_t i,
              PyObject *const *captured, PyObject *all_outs)
{
    const rt_output *o = &plan->outputs[i];
    PyObject *base = NULL, *out, *target, *result;
    switch (o->kind) {
    case RT_OUT_PASS:
        return fw_out(all_outs, plan->num_mutated, i);
    case RT_OUT_IS_INPUT:
        return Py_NewRef(captured[o->index]);
    case RT_OUT_ALIAS_OF_INPUT:
        base = Py_NewRef(captured[o->index]);
        break;
    case RT_OUT_ALIAS_OF_INTERMEDIATE:
        base = fw_out(all_outs, plan->num_mutated, o->index);
        if (base != NULL && o->unwrap_base) {
            Py_SETREF(base, rt_unwrap_tensoralias(st, base));
        }
        if (base == NULL) {
            return NULL;
        }
        break;
    default:
        PyErr_SetString(PyExc_SystemError, "torch_aot_rt: bad output kind");
        return NULL;
    }
    out = fw_out(all_outs, plan->num_mutated, i);
    if (out == NULL) {
        Py_DECREF(base);
        return NULL;
    }
    target = plan->trace_joint ? rt_unwrap_tensoralias(st, out) : Py_NewRef(out);
    Py_DECREF(out);
    if (target == NULL) {
        Py_DECREF(base);
        return NULL;
    }
    /* gen_alias_from_base: the recorded ViewMeta sequence replayed where
     * upstream replays it, else its view-function / as_strided branches */
    if (o->replay_sequence != NULL) {
        result = rt_alias_by_view_replay(st, base, target, o->requires_grad == Py_True,
                                         o->replay_sequence, o->replay_cpp);
    }
    else {
        result = rt_alias_from_base(st, base, target, o->requires_grad == Py_True,
                                    plan->alias_translates_storage_offset);
    }
    Py_DECREF(base);
    Py_DECREF(target);
    return result;
}

PyObject *
rt_finalize(rt_state *st, const rt_plan *plan, PyObject *const *captured,
            PyObject *all_outs)
{
    Py_ssize_t n = PyList_GET_SIZE(all_outs);
    if (n != plan->expected_outs) {
        PyErr_Format(PyExc_AssertionError, "expected %zd outputs, got %zd",
                     plan->expected_outs, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < plan->num_mutated; i++) {
        const rt_mutation *m = &plan->mutations[i];
        PyObject *updated = Py_NewRef(PyList_GET_ITEM(all_outs, i));
        int rc = apply_mutation(st, plan, m, captured[m->slot], updated);
        Py_DECREF(updated);
        if (rc < 0) {
            return NULL;
        }
    }

    PyObject *ret;
    if (plan->outputs != NULL) {
        ret = PyList_New(plan->n_outputs);
        if (ret == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < plan->n_outputs; i++) {
            PyObject *item = replay_output(st, plan, i, captured, all_outs);
            if (item == NULL) {
                goto fail;
            }
            PyList_SET_ITEM(ret, i, item);
        }
    }
    else if (plan->num_mutated > 0) {
        ret = PyList_GetSlice(all_outs, plan->num_mutated, n);
    }
    else {
        ret = Py_NewRef(all_outs);
    }
    if (ret == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < plan->n_dynamic; i++) {
        const rt_dynamic_dims *d = &plan->dynamic[i];
        if (d->out_index >= PyList_GET_SIZE(ret)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            goto fail;
        }
        if (rt_mark_dynamic_indices(st, PyList_GET_ITEM(ret, d->out_index), d->dims,
                                    plan->dynamic_attr) < 0) {
            goto fail;
        }
    }
    if (plan->grad_enabled_mutation >= 0 &&
        rt_set_grad_enabled(st, plan->grad_enabled_mutation) < 0) {
        goto fail;
    }
    return ret;
fail:
    Py_DECREF(ret);
    return NULL;
}
