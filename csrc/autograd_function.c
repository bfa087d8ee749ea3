/* autograd_function.c: CompiledFunction's apply, forward and backward in C.
 *
 * Mirrors, in runtime_wrappers.py: Function.apply's Python layer for the
 * class; _codegen_compiled_forward with _AutogradSavedState.save_from_forward
 * and the generated _AutogradForwardEpilogue.finalize; _codegen_compiled_backward
 * with _codegen_backward_prologue, CompiledFunction._backward_impl and
 * _codegen_backward_epilogue. The class itself, its attributes and the parts
 * compiled autograd traces (_bw_prologue_fn, _bw_epilogue_fn, ...) stay
 * upstream's. Where the C version differs on purpose:
 * - CompiledFunction.compiled_fw is read when the class is built, and
 *   CompiledFunction.compiled_bw is assigned once, when the backward is first
 *   compiled, not on every backward (it never changes after);
 * - config.debug_assert is read when the class is built (the plan falls back
 *   to upstream when it is on).
 */
#include "autograd_function.h"

#include <stddef.h>
#include <structmember.h>

#include "plan.h"

#define RT_STACK_ARGS 16

/* ---- shared object plumbing ------------------------------------------- */

#define RT_FN_HEAD                                                           \
    PyObject_HEAD                                                            \
    vectorcallfunc vectorcall;                                               \
    rt_state *st;                                                            \
    PyObject *module;                                                        \
    PyObject *dict;                                                          \
    PyObject *weakreflist;

typedef struct {
    RT_FN_HEAD
} FnObject;

static rt_state *
bound_state(PyTypeObject *type, PyObject **module)
{
    *module = PyType_GetModule(type);
    if (*module == NULL) {
        return NULL;
    }
    rt_state *st = PyModule_GetState(*module);
    if (!st->bound) {
        PyErr_SetString(PyExc_RuntimeError,
                        "torch_aot_rt._C: _bind_torch() must be called first");
        return NULL;
    }
    return st;
}

static PyObject *
fn_alloc(PyTypeObject *type, vectorcallfunc call)
{
    PyObject *module;
    rt_state *st = bound_state(type, &module);
    if (st == NULL) {
        return NULL;
    }
    FnObject *self = (FnObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = call;
    self->st = st;
    self->module = Py_NewRef(module);
    return (PyObject *)self;
}

static int
index_or_none(PyObject *v, const char *what, Py_ssize_t *out)
{
    if (v == Py_None) {
        *out = -1;
        return 0;
    }
    if (!PyLong_Check(v) || (*out = PyLong_AsSsize_t(v)) < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "plan: %s must be a non-negative int or None", what);
        }
        return -1;
    }
    return 0;
}

/* (start, stop) of a Python slice with step 1; None is kept as the
 * "open" bound and negative bounds count from the end, at call time. */
static int
parse_span(PyObject *kwargs, const char *key, Py_ssize_t span[2])
{
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        return -1;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be a (start, stop) tuple", key);
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *b = PyTuple_GET_ITEM(v, k);
        if (b == Py_None) {
            span[k] = k == 0 ? 0 : PY_SSIZE_T_MAX;
            continue;
        }
        if (!PyLong_Check(b)) {
            PyErr_Format(PyExc_ValueError, "plan: %s bounds must be ints or None", key);
            return -1;
        }
        span[k] = PyLong_AsSsize_t(b);
        if (span[k] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
callable_or_null(PyObject *kwargs, const char *key, int *err)
{
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        *err = 1;
        return NULL;
    }
    if (v == Py_None) {
        return NULL;
    }
    if (!PyCallable_Check(v)) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be callable or None", key);
        *err = 1;
        return NULL;
    }
    return Py_NewRef(v);
}

/* list(x) normalisation of a compiled function's result
 * (_codegen_normalize_as_list / normalize_as_list). Steals `out`. */
static PyObject *
as_list(PyObject *out)
{
    if (out == NULL || PyList_Check(out)) {
        return out;
    }
    if (PyTuple_Check(out)) {
        Py_SETREF(out, PySequence_List(out));
        return out;
    }
    PyObject *list = PyList_New(1);
    if (list == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, out);
    return list;
}

/* [with _DisableAutocast():] fn(list) -> list */
static PyObject *
call_boxed(rt_state *st, PyObject *fn, PyObject *list, bool disable_amp)
{
    PyObject *guard = NULL;
    if (disable_amp && (guard = rt_disable_autocast_enter(st)) == NULL) {
        return NULL;
    }
    PyObject *out = as_list(PyObject_Vectorcall(fn, &list, 1, NULL));
    if (guard != NULL && rt_disable_autocast_exit(st, guard, out == NULL) < 0) {
        Py_CLEAR(out);
    }
    return out;
}

static int
set_attr(PyObject *obj, PyObject *name, PyObject *value)
{
    int rc = value ? PyObject_SetAttr(obj, name, value) : -1;
    Py_XDECREF(value);
    return rc;
}

/* ======================================================================
 * FunctionApply: `CompiledFunction.apply`, boxed.
 *
 * Function.apply (torch/autograd/function.py) does, for a class without
 * setup_context: if no functorch transform is active, unwrap dead functorch
 * wrappers among the tensor args and call _FunctionBase.apply; else go
 * through custom_function_call. We do the first directly, with the same
 * unwrap_if_dead per tensor, and hand the second to upstream's Python.
 * ====================================================================== */

typedef struct {
    RT_FN_HEAD
    PyObject *apply_base;    /* _FunctionBase.apply bound to the class */
    PyObject *apply_python;  /* CompiledFunction.apply: Function.apply */
} FunctionApply;

static PyObject *
FunctionApply_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                         PyObject *kwnames)
{
    FunctionApply *self = (FunctionApply *)op;
    rt_state *st = self->st;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "CompiledFunction boxed apply takes the list of arguments");
        return NULL;
    }
    /* upstream's make_boxed_func(apply): g(args) = apply(*args) */
    PyObject *args = PySequence_Tuple(argv[0]);
    if (args == NULL) {
        return NULL;
    }
    PyObject *result = NULL;
    int active = -1;
    PyObject *r = PyObject_CallNoArgs(st->functorch_transforms_active);
    if (r != NULL) {
        active = PyObject_IsTrue(r);
        Py_DECREF(r);
    }
    if (active < 0) {
        goto done;
    }
    if (active) {
        result = PyObject_Call(self->apply_python, args, NULL);
        goto done;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *stack_args[RT_STACK_ARGS];
    PyObject **stack = n <= RT_STACK_ARGS ? stack_args : PyMem_Malloc(n * sizeof(PyObject *));
    if (stack == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t filled = 0;
    for (; filled < n; filled++) {
        PyObject *arg = PyTuple_GET_ITEM(args, filled);
        int is_tensor = rt_is_tensor(st, arg);
        if (is_tensor < 0) {
            break;
        }
        stack[filled] = is_tensor ? PyObject_Vectorcall(st->unwrap_if_dead, &arg, 1, NULL)
                                  : Py_NewRef(arg);
        if (stack[filled] == NULL) {
            break;
        }
    }
    if (filled == n) {
        result = PyObject_Vectorcall(self->apply_base, stack, n, NULL);
    }
    for (Py_ssize_t i = 0; i < filled; i++) {
        Py_DECREF(stack[i]);
    }
    if (stack != stack_args) {
        PyMem_Free(stack);
    }
done:
    Py_DECREF(args);
    return result;
}

static PyObject *
FunctionApply_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *cls;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "FunctionApply() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:FunctionApply", &cls)) {
        return NULL;
    }
    FunctionApply *self = (FunctionApply *)fn_alloc(type, FunctionApply_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    rt_state *st = self->st;
    int sub = PyType_Check(cls) ? PyObject_IsSubclass(cls, st->FunctionBase) : 0;
    if (sub <= 0) {
        if (sub == 0) {
            PyErr_SetString(PyExc_ValueError, "plan: FunctionApply needs an autograd.Function class");
        }
        Py_DECREF(self);
        return NULL;
    }
    descrgetfunc get = Py_TYPE(st->function_base_apply)->tp_descr_get;
    self->apply_base = get ? get(st->function_base_apply, NULL, cls) : NULL;
    self->apply_python = PyObject_GetAttrString(cls, "apply");
    if (self->apply_base == NULL || self->apply_python == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_FunctionBase.apply is not a descriptor");
        }
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
FunctionApply_traverse(FunctionApply *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->apply_base);
    Py_VISIT(self->apply_python);
    return 0;
}

static int
FunctionApply_clear(FunctionApply *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->apply_base);
    Py_CLEAR(self->apply_python);
    return 0;
}

/* ======================================================================
 * CompiledForward: CompiledFunction.forward(ctx, *args)
 * ====================================================================== */

typedef struct {
    Py_ssize_t n;
    Py_ssize_t *idx;
} index_array;

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;           /* upstream's forward: calls we don't take */
    PyObject *compiled_fw;
    PyObject *rng_add;            /* rng_state.add_forward_args, or NULL */
    Py_ssize_t backward_state_index; /* -1: none */
    bool disable_amp;
    Py_ssize_t num_forward_returns;
    Py_ssize_t saved_vc[2], saved_no_vc[2], saved_symints[2], saved_opaque[2];
    Py_ssize_t n_dynamic;
    Py_ssize_t *dynamic_idx;
    PyObject **dynamic_dims;
    index_array metadata_wraps;   /* mutated inputs with metadata-only mutations */
    index_array unsafe_views;
    index_array aliased_outs;
    index_array non_diff;
} CompiledForward;

/* "expected all <what> to be <kind>, got types: [<types>]" */
static void
raise_types(const char *what, const char *kind, PyObject *items)
{
    PyObject *types = PyList_New(PyList_GET_SIZE(items));
    if (types == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyList_SET_ITEM(types, i, Py_NewRef((PyObject *)Py_TYPE(PyList_GET_ITEM(items, i))));
    }
    PyErr_Format(PyExc_AssertionError, "expected all %s to be %s, got types: %R",
                 what, kind, types);
    Py_DECREF(types);
}

/* [x.detach() if x._is_view() else x for x in tensors], checking they are
 * tensors first (_AutogradSavedState.save_from_forward). */
static PyObject *
detach_views(rt_state *st, PyObject *tensors, const char *what)
{
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = rt_is_tensor(st, PyList_GET_ITEM(tensors, i));
        if (ok <= 0) {
            if (ok == 0) {
                raise_types(what, "Tensors", tensors);
            }
            return NULL;
        }
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(tensors, i);
        PyObject *is_view = rt_tensor_call(st, RT_IS_VIEW, x, NULL, 0);
        int v = is_view ? PyObject_IsTrue(is_view) : -1;
        Py_XDECREF(is_view);
        PyObject *saved = v < 0 ? NULL : v ? rt_tensor_call(st, RT_DETACH, x, NULL, 0)
                                           : Py_NewRef(x);
        if (saved == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, saved);
    }
    return out;
}

/* list[start:stop], Python's slice semantics */
static PyObject *
span_of(PyObject *list, const Py_ssize_t span[2])
{
    Py_ssize_t start = span[0], stop = span[1];
    PySlice_AdjustIndices(PyList_GET_SIZE(list), &start, &stop, 1);
    return PyList_GetSlice(list, start, stop);
}

static int
save_from_forward(CompiledForward *self, PyObject *ctx, PyObject *fw_outs)
{
    rt_state *st = self->st;
    int rc = -1;
    PyObject *vc = NULL, *no_vc = NULL, *to_save = NULL, *no_vc_saved = NULL;
    PyObject *symints = NULL, *opaque = NULL;
    if ((vc = span_of(fw_outs, self->saved_vc)) == NULL ||
        (no_vc = span_of(fw_outs, self->saved_no_vc)) == NULL) {
        goto done;
    }
    /* both type checks come before any detach, as upstream */
    for (int pass = 0; pass < 2; pass++) {
        PyObject *items = pass ? no_vc : vc;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            int ok = rt_is_tensor(st, PyList_GET_ITEM(items, i));
            if (ok <= 0) {
                if (ok == 0) {
                    raise_types(pass ? "tensors_saved_no_vc_check" : "tensors_saved_with_vc_check",
                                "Tensors", items);
                }
                goto done;
            }
        }
    }
    /* See Note [Detaching saved tensors in AOTAutograd] upstream. */
    if ((to_save = detach_views(st, vc, "tensors_saved_with_vc_check")) == NULL ||
        (no_vc_saved = detach_views(st, no_vc, "tensors_saved_no_vc_check")) == NULL) {
        goto done;
    }
    Py_ssize_t num_vc = PyList_GET_SIZE(to_save);
    for (Py_ssize_t k = 0; k < self->n_dynamic; k++) {
        Py_ssize_t idx = self->dynamic_idx[k];
        PyObject *target = idx < num_vc ? to_save : no_vc_saved;
        Py_ssize_t at = idx < num_vc ? idx : idx - num_vc;
        if (at >= PyList_GET_SIZE(target)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            goto done;
        }
        if (rt_mark_dynamic_indices(st, PyList_GET_ITEM(target, at), self->dynamic_dims[k]) < 0) {
            goto done;
        }
    }
    /* ctx.save_for_backward(*tensors_to_save) is `ctx.to_save = tensors` */
    if (set_attr(ctx, st->str_to_save, PyList_AsTuple(to_save)) < 0 ||
        PyObject_SetAttr(ctx, st->str_tensors_no_vc_check, no_vc_saved) < 0) {
        goto done;
    }
    if ((symints = span_of(fw_outs, self->saved_symints)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(symints); i++) {
        PyObject *x = PyList_GET_ITEM(symints, i);
        int ok = PyLong_Check(x) || PyFloat_Check(x);
        if (!ok && (ok = PyObject_IsInstance(x, st->SymInt)) == 0) {
            ok = PyObject_IsInstance(x, st->SymFloat);
        }
        if (ok <= 0) {
            if (ok == 0) {
                raise_types("symint_outs", "int/float/SymInt/SymFloat", symints);
            }
            goto done;
        }
    }
    if (PyObject_SetAttr(ctx, st->str_symints, symints) < 0 ||
        (opaque = span_of(fw_outs, self->saved_opaque)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(opaque); i++) {
        PyObject *x = PyList_GET_ITEM(opaque, i);
        int ok = 0;
        if (st->is_opaque_type != Py_None) {
            PyObject *tp = (PyObject *)Py_TYPE(x);
            PyObject *r = PyObject_Vectorcall(st->is_opaque_type, &tp, 1, NULL);
            ok = r ? PyObject_IsTrue(r) : -1;
            Py_XDECREF(r);
            if (ok == 0) {
                ok = PyObject_IsInstance(x, st->OpaqueBase);
            }
        }
        if (ok <= 0) {
            if (ok == 0) {
                raise_types("opaque_object_outs", "opaque types", opaque);
            }
            goto done;
        }
    }
    if (PyObject_SetAttr(ctx, st->str_opaque_objects, opaque) < 0) {
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(vc);
    Py_XDECREF(no_vc);
    Py_XDECREF(to_save);
    Py_XDECREF(no_vc_saved);
    Py_XDECREF(symints);
    Py_XDECREF(opaque);
    return rc;
}

/* raw_returns[i] = f(raw_returns[i]) for each i; IndexError as upstream */
static int
rewrite_returns(rt_state *st, PyObject *raw, const index_array *where, int unsafe_view)
{
    for (Py_ssize_t k = 0; k < where->n; k++) {
        Py_ssize_t i = where->idx[k];
        if (i >= PyList_GET_SIZE(raw)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            return -1;
        }
        PyObject *o = PyList_GET_ITEM(raw, i);
        PyObject *v;
        if (unsafe_view) {
            /* torch.ops.aten._unsafe_view(o, o.shape) */
            PyObject *shape = PyObject_GetAttr(o, st->str_shape);
            if (shape == NULL) {
                return -1;
            }
            PyObject *argv[2] = {o, shape};
            v = PyObject_Vectorcall(st->unsafe_view, argv, 2, NULL);
            Py_DECREF(shape);
        }
        else {
            v = PyObject_CallOneArg(st->TensorAlias, o);
        }
        if (v == NULL || PyList_SetItem(raw, i, v) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The generated _AutogradForwardEpilogue.finalize. */
static PyObject *
finalize_forward(CompiledForward *self, PyObject *ctx, PyObject *fw_outs)
{
    rt_state *st = self->st;
    PyObject *raw = PyList_GetSlice(fw_outs, 0, self->num_forward_returns);
    if (raw == NULL) {
        return NULL;
    }
    if (rewrite_returns(st, raw, &self->metadata_wraps, 0) < 0 ||
        rewrite_returns(st, raw, &self->unsafe_views, 1) < 0 ||
        rewrite_returns(st, raw, &self->aliased_outs, 0) < 0) {
        goto fail;
    }
    /* non_diff = [raw[i] for i in non_diff_indices if isinstance(raw[i], Tensor)] */
    PyObject *non_diff = PyTuple_New(self->non_diff.n);
    if (non_diff == NULL) {
        goto fail;
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < self->non_diff.n; k++) {
        Py_ssize_t i = self->non_diff.idx[k];
        if (i >= PyList_GET_SIZE(raw)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            Py_DECREF(non_diff);
            goto fail;
        }
        PyObject *x = PyList_GET_ITEM(raw, i);
        int is_tensor = rt_is_tensor(st, x);
        if (is_tensor < 0) {
            Py_DECREF(non_diff);
            goto fail;
        }
        if (is_tensor) {
            PyTuple_SET_ITEM(non_diff, m++, Py_NewRef(x));
        }
    }
    if (m != self->non_diff.n && _PyTuple_Resize(&non_diff, m) < 0) {
        goto fail;
    }
    /* ctx.mark_non_differentiable(*non_diff) is `ctx.non_differentiable = args` */
    if (set_attr(ctx, st->str_non_differentiable, non_diff) < 0 ||
        PyObject_SetAttr(ctx, st->str_materialize_non_diff_grads, Py_False) < 0) {
        goto fail;
    }
    PyObject *result = PyList_AsTuple(raw);
    Py_DECREF(raw);
    return result;
fail:
    Py_DECREF(raw);
    return NULL;
}

static PyObject *
CompiledForward_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                           PyObject *kwnames)
{
    CompiledForward *self = (CompiledForward *)op;
    rt_state *st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || kwnames != NULL) {
        /* Not how autograd calls it: upstream's forward binds (or rejects)
         * the arguments with its own messages. */
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *ctx = argv[0];
    PyObject *const *args = argv + 1;
    Py_ssize_t n = nargs - 1;
    if (self->backward_state_index >= 0) {
        if (self->backward_state_index >= n) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return NULL;
        }
        PyObject *bw_state = args[self->backward_state_index];
        int ok = PyObject_IsInstance(bw_state, st->BackwardState);
        if (ok <= 0) {
            if (ok == 0) {
                PyErr_Format(PyExc_AssertionError, "expected BackwardState, got %S",
                             (PyObject *)Py_TYPE(bw_state));
            }
            return NULL;
        }
        if (PyObject_SetAttr(ctx, st->str_backward_state, bw_state) < 0) {
            return NULL;
        }
    }
    PyObject *list;
    if (self->rng_add != NULL) {
        /* args = rng_state.add_forward_args(ctx, args): upstream's tracker */
        PyObject *tuple = PyTuple_New(n);
        if (tuple == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        }
        PyObject *cargs[2] = {ctx, tuple};
        PyObject *extended = PyObject_Vectorcall(self->rng_add, cargs, 2, NULL);
        Py_DECREF(tuple);
        if (extended == NULL) {
            return NULL;
        }
        list = PySequence_List(extended);
        Py_DECREF(extended);
    }
    else {
        list = PyList_New(n);
        if (list != NULL) {
            for (Py_ssize_t i = 0; i < n; i++) {
                PyList_SET_ITEM(list, i, Py_NewRef(args[i]));
            }
        }
    }
    if (list == NULL) {
        return NULL;
    }
    PyObject *fw_outs = call_boxed(st, self->compiled_fw, list, self->disable_amp);
    Py_DECREF(list);
    if (fw_outs == NULL) {
        return NULL;
    }
    PyObject *result = NULL;
    if (save_from_forward(self, ctx, fw_outs) == 0) {
        result = finalize_forward(self, ctx, fw_outs);
    }
    Py_DECREF(fw_outs);
    return result;
}

static int
parse_index_array(PyObject *kwargs, const char *key, index_array *out)
{
    return rt_plan_indices(kwargs, key, &out->n, &out->idx);
}

static PyObject *
CompiledForward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "CompiledForward takes keyword arguments only");
        return NULL;
    }
    CompiledForward *self = (CompiledForward *)fn_alloc(type, CompiledForward_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    int err = 0;
    PyObject *v;
    bool disable_amp;
    if ((self->upstream = callable_or_null(kwargs, "upstream", &err)) == NULL) {
        if (!err) {
            PyErr_SetString(PyExc_ValueError, "plan: upstream must be callable");
        }
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "compiled_fw")) == NULL) {
        goto fail;
    }
    if (!PyCallable_Check(v)) {
        PyErr_SetString(PyExc_ValueError, "plan: compiled_fw must be callable");
        goto fail;
    }
    self->compiled_fw = Py_NewRef(v);
    self->rng_add = callable_or_null(kwargs, "rng_add_forward_args", &err);
    if (err || (v = rt_plan_required(kwargs, "backward_state_index")) == NULL ||
        index_or_none(v, "backward_state_index", &self->backward_state_index) < 0 ||
        rt_plan_bool(kwargs, "disable_amp", &disable_amp) < 0 ||
        (v = rt_plan_required(kwargs, "num_forward_returns")) == NULL ||
        index_or_none(v, "num_forward_returns", &self->num_forward_returns) < 0 ||
        parse_span(kwargs, "saved_vc", self->saved_vc) < 0 ||
        parse_span(kwargs, "saved_no_vc", self->saved_no_vc) < 0 ||
        parse_span(kwargs, "saved_symints", self->saved_symints) < 0 ||
        parse_span(kwargs, "saved_opaque", self->saved_opaque) < 0 ||
        parse_index_array(kwargs, "metadata_mutation_wraps", &self->metadata_wraps) < 0 ||
        parse_index_array(kwargs, "unsafe_view_outputs", &self->unsafe_views) < 0 ||
        parse_index_array(kwargs, "aliased_outputs", &self->aliased_outs) < 0 ||
        parse_index_array(kwargs, "non_differentiable", &self->non_diff) < 0) {
        goto fail;
    }
    self->disable_amp = disable_amp;
    if (self->num_forward_returns < 0) {
        PyErr_SetString(PyExc_ValueError, "plan: num_forward_returns must be an int");
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "dynamic_saved")) == NULL) {
        goto fail;
    }
    if (!PyTuple_Check(v)) {
        PyErr_SetString(PyExc_ValueError, "plan: dynamic_saved must be a tuple of (index, set)");
        goto fail;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(v);
    self->dynamic_idx = PyMem_Calloc(nd ? nd : 1, sizeof(Py_ssize_t));
    self->dynamic_dims = PyMem_Calloc(nd ? nd : 1, sizeof(PyObject *));
    if (!self->dynamic_idx || !self->dynamic_dims) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < nd; k++) {
        PyObject *rec = PyTuple_GET_ITEM(v, k);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 2 ||
            !PyAnySet_Check(PyTuple_GET_ITEM(rec, 1)) ||
            index_or_none(PyTuple_GET_ITEM(rec, 0), "dynamic_saved index",
                          &self->dynamic_idx[k]) < 0 ||
            self->dynamic_idx[k] < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "plan: dynamic_saved must be a tuple of (index, set)");
            }
            goto fail;
        }
        self->dynamic_dims[k] = Py_NewRef(PyTuple_GET_ITEM(rec, 1));
        self->n_dynamic = k + 1;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
CompiledForward_traverse(CompiledForward *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fw);
    Py_VISIT(self->rng_add);
    for (Py_ssize_t k = 0; k < self->n_dynamic; k++) {
        Py_VISIT(self->dynamic_dims[k]);
    }
    return 0;
}

static int
CompiledForward_clear(CompiledForward *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fw);
    Py_CLEAR(self->rng_add);
    for (Py_ssize_t k = 0; k < self->n_dynamic; k++) {
        Py_CLEAR(self->dynamic_dims[k]);
    }
    return 0;
}

static void
CompiledForward_free_arrays(CompiledForward *self)
{
    PyMem_Free(self->dynamic_idx);
    PyMem_Free(self->dynamic_dims);
    PyMem_Free(self->metadata_wraps.idx);
    PyMem_Free(self->unsafe_views.idx);
    PyMem_Free(self->aliased_outs.idx);
    PyMem_Free(self->non_diff.idx);
}

/* ======================================================================
 * CompiledBackward: CompiledFunction.backward(ctx, grads)
 * ====================================================================== */

enum tangent_kind {
    TANGENT_STRIDES = 0,       /* plain tensor meta: expected size and stride */
    TANGENT_MEMORY_FORMAT = 1, /* plain tensor meta: expected memory format */
    TANGENT_PYTHON = 2,        /* anything else: upstream's process_runtime_tangent */
};

typedef struct {
    int kind;
    PyObject *meta;            /* PlainTensorMeta / SubclassCreationMeta */
    PyObject *memory_format_meta;
    PyObject *size, *stride, *memory_format;
    PyObject *desc, *stack_trace, *index;
} tangent_plan;

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;        /* upstream's backward: calls we don't take */
    PyObject *cls;             /* CompiledFunction */
    PyObject *double_backward; /* CompiledFunction._double_backward */
    PyObject *backward_compiler; /* upstream's _AutogradBackwardCompiler */
    PyObject *fw_metadata;
    PyObject *rng_add;         /* rng_state.add_backward_args, or NULL */
    PyObject *compile_id;
    PyObject *compiled_bw;     /* NULL until the first backward compiles it */
    bool compiled_bw_boxed;
    bool disable_amp;
    bool has_backward_state;
    bool check_deterministic;
    bool has_mutations_in_bw;
    bool inputs_require_grad;
    bool has_no_vc_check;
    Py_ssize_t expected_grad_outs;
    Py_ssize_t num_backward_tokens;
    Py_ssize_t n_surviving;
    Py_ssize_t *surviving;
    tangent_plan *tangents;    /* n_surviving entries */
} CompiledBackward;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *backward;        /* the CompiledBackward */
    PyObject *ctx;
    PyObject *all_args;
} BackwardThunk;

static PyObject *
call_noargs_checked(PyObject *fn)
{
    return PyObject_CallNoArgs(fn);
}

static int
raise_runtime(const char *msg)
{
    PyErr_SetString(PyExc_RuntimeError, msg);
    return -1;
}

/* AOTDispatchAutograd.process_runtime_tangent(x, meta, j, ...)[0] with the
 * common case, a plain torch.Tensor, in C: coerce_to_expected_memory_format
 * is a no-op when strides (or the memory format) already match. */
static PyObject *
process_tangent(CompiledBackward *self, const tangent_plan *t, PyObject *x)
{
    rt_state *st = self->st;
    if (Py_IS_TYPE(x, st->Tensor) && t->kind != TANGENT_PYTHON) {
        int same;
        if (t->kind == TANGENT_STRIDES) {
            PyObject *shape = rt_tensor_call(st, RT_SIZE, x, NULL, 0);
            same = shape ? PyObject_RichCompareBool(shape, t->size, Py_EQ) : -1;
            Py_XDECREF(shape);
            if (same > 0) {
                PyObject *stride = rt_tensor_call(st, RT_STRIDE, x, NULL, 0);
                same = stride ? PyObject_RichCompareBool(stride, t->stride, Py_EQ) : -1;
                Py_XDECREF(stride);
            }
        }
        else {
            PyObject *argv[2] = {x, t->memory_format};
            PyObject *r = PyObject_Vectorcall(st->tensor_methods[RT_IS_CONTIGUOUS], argv, 1,
                                              st->kwnames_memory_format);
            same = r ? PyObject_IsTrue(r) : -1;
            Py_XDECREF(r);
        }
        if (same < 0) {
            return NULL;
        }
        if (same) {
            return Py_NewRef(x);
        }
        PyObject *argv[2] = {x, t->memory_format_meta};
        return PyObject_Vectorcall(st->coerce_memory_format, argv, 2, NULL);
    }
    if (!Py_IS_TYPE(x, st->Tensor)) {
        int is_tensor = rt_is_tensor(st, x);
        if (is_tensor <= 0) {
            return is_tensor < 0 ? NULL : Py_NewRef(x); /* not a tensor: as is */
        }
    }
    PyObject *argv[6] = {x, t->meta, t->index, t->desc, self->compile_id, t->stack_trace};
    PyObject *pair = PyObject_Vectorcall(st->process_runtime_tangent, argv, 6, NULL);
    if (pair == NULL) {
        return NULL;
    }
    PyObject *first = PySequence_GetItem(pair, 0);
    Py_DECREF(pair);
    return first;
}

/* list.extend(seq) for a borrowed sequence */
static int
extend(PyObject *list, PyObject *seq)
{
    return PyList_SetSlice(list, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, seq);
}

/* _codegen_backward_prologue's _backward_prologue: all_args for the
 * compiled backward, with the grads list cleared. */
static PyObject *
backward_prologue(CompiledBackward *self, PyObject *saved, PyObject *symints,
                  PyObject *opaque, PyObject *grads)
{
    rt_state *st = self->st;
    PyObject *stack = call_noargs_checked(st->peek_interpreter_stack);
    if (stack == NULL) {
        return NULL;
    }
    int in_transform = stack != Py_None;
    Py_DECREF(stack);
    if (in_transform) {
        raise_runtime("It looks like you're trying to call a compiled backward function "
                      "within vmap/grad/vjp, which isn't supported. Try wrapping vmap "
                      "inside torch.compile, or skip compiling the backward function.");
        return NULL;
    }
    if (self->check_deterministic) {
        PyObject *r = call_noargs_checked(st->deterministic_enabled);
        int on = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (on != 0) {
            if (on > 0) {
                raise_runtime("This compiled backward function is being run with "
                              "torch.use_deterministic_algorithms(True), but it was "
                              "previously generated during the forward function while "
                              "torch.use_deterministic_algorithms(False) was set.");
            }
            return NULL;
        }
    }
    Py_ssize_t n_grads = PyList_GET_SIZE(grads);
    if (n_grads != self->expected_grad_outs) {
        PyErr_Format(PyExc_AssertionError, "expected %zd grad_outs, got %zd",
                     self->expected_grad_outs, n_grads);
        return NULL;
    }
    PyObject *all_args = PyList_New(0);
    if (all_args == NULL) {
        return NULL;
    }
    if (extend(all_args, symints) < 0 || extend(all_args, saved) < 0 ||
        extend(all_args, opaque) < 0) {
        goto fail;
    }
    Py_ssize_t ts = PyList_GET_SIZE(all_args);
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        if (PyList_Append(all_args, PyList_GET_ITEM(grads, self->surviving[j])) < 0) {
            goto fail;
        }
    }
    /* The grads are ours now: let dropped ones die mid-backward. */
    if (PyList_SetSlice(grads, 0, PyList_GET_SIZE(grads), NULL) < 0) {
        goto fail;
    }
    for (Py_ssize_t k = 0; k < self->num_backward_tokens; k++) {
        if (PyList_Append(all_args, Py_None) < 0) {
            goto fail;
        }
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        PyObject *x = PyList_GET_ITEM(all_args, ts + j);
        Py_INCREF(x);
        PyObject *processed = process_tangent(self, &self->tangents[j], x);
        Py_DECREF(x);
        if (processed == NULL || PyList_SetItem(all_args, ts + j, processed) < 0) {
            goto fail;
        }
    }
    if (self->has_mutations_in_bw) {
        int grad = rt_grad_enabled(st);
        if (grad != 0) {
            if (grad > 0) {
                raise_runtime("aot_autograd does not support input mutations with "
                              "requires_grad in backward for create_graph=True");
            }
            goto fail;
        }
    }
    return all_args;
fail:
    Py_DECREF(all_args);
    return NULL;
}

/* CompiledFunction._backward_impl + the generated _backward_epilogue. */
static PyObject *
backward_impl(CompiledBackward *self, PyObject *ctx, PyObject *all_args)
{
    rt_state *st = self->st;
    if (self->has_backward_state) {
        PyErr_SetString(PyExc_AssertionError, "BackwardState requires CompiledAutograd");
        return NULL;
    }
    PyObject *r = PyObject_Vectorcall(st->maybe_clear_saved_tensors, &ctx, 1, NULL);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    r = call_noargs_checked(st->keep_graph);
    int keep_graph = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (keep_graph < 0) {
        return NULL;
    }
    if (self->compiled_bw == NULL) {
        /* The lazy backward compile, exactly upstream's (DDP buckets and
         * donated buffers included): backward_compiler.get_or_compile. */
        PyObject *argv[2] = {self->backward_compiler, keep_graph ? Py_False : Py_True};
        PyObject *compiled = PyObject_VectorcallMethod(st->str_get_or_compile, argv,
                                                       1,
                                                       st->kwnames_use_once);
        if (compiled == NULL) {
            return NULL;
        }
        if (PyObject_SetAttr(self->cls, st->str_compiled_bw, compiled) < 0) {
            Py_DECREF(compiled);
            return NULL;
        }
        PyObject *boxed = PyObject_GetAttr(compiled, st->str_boxed_call);
        int is_boxed = 0;
        if (boxed == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                Py_DECREF(compiled);
                return NULL;
            }
            PyErr_Clear();
        }
        else {
            is_boxed = PyObject_IsTrue(boxed);
            Py_DECREF(boxed);
            if (is_boxed < 0) {
                Py_DECREF(compiled);
                return NULL;
            }
        }
        self->compiled_bw_boxed = is_boxed;
        Py_XSETREF(self->compiled_bw, compiled);
    }
    if (keep_graph) {
        /* donated buffers need saved tensors used once */
        PyObject *donated = PyObject_GetAttr(st->functorch_config, st->str_donated_buffer);
        int on = donated ? PyObject_IsTrue(donated) : -1;
        Py_XDECREF(donated);
        if (on > 0) {
            PyObject *idxs = PyObject_GetAttr(self->fw_metadata, st->str_bw_donated_idxs);
            PyObject *empty = idxs ? PyList_New(0) : NULL;
            on = empty ? PyObject_RichCompareBool(idxs, empty, Py_NE) : -1;
            Py_XDECREF(idxs);
            Py_XDECREF(empty);
            if (on > 0) {
                raise_runtime(
                    "This backward function was compiled with non-empty donated buffers "
                    "which requires create_graph=False and retain_graph=False. Please keep "
                    "backward(create_graph=False, retain_graph=False) across all backward() "
                    "function calls, or set torch._functorch.config.donated_buffer=False to "
                    "disable donated buffer.");
                return NULL;
            }
        }
        if (on < 0) {
            return NULL;
        }
    }
    PyObject *compiled_bw = Py_NewRef(self->compiled_bw);
    PyObject *out;
    if (self->compiled_bw_boxed) {
        out = call_boxed(st, compiled_bw, all_args, self->disable_amp);
    }
    else {
        /* an unboxed compiler: upstream warns and unpacks; let it */
        PyObject *argv[4] = {compiled_bw, all_args, Py_True,
                             self->disable_amp ? Py_True : Py_False};
        out = as_list(PyObject_Vectorcall(st->call_func_at_runtime, argv, 2,
                                          st->kwnames_steal_disable_amp));
    }
    Py_DECREF(compiled_bw);
    if (out == NULL) {
        return NULL;
    }
    if (self->num_backward_tokens > 0) {
        Py_ssize_t keep = PyList_GET_SIZE(out) - self->num_backward_tokens;
        Py_SETREF(out, PyList_GetSlice(out, 0, keep < 0 ? 0 : keep));
        if (out == NULL) {
            return NULL;
        }
    }
    Py_SETREF(out, PyList_AsTuple(out));
    return out;
}

static PyObject *
thunk_new(CompiledBackward *self, PyObject *ctx, PyObject *all_args);

static PyObject *
CompiledBackward_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                            PyObject *kwnames)
{
    CompiledBackward *self = (CompiledBackward *)op;
    rt_state *st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL || !PyList_Check(argv[1])) {
        /* Not the boxed call autograd makes: upstream's backward binds the
         * arguments and raises its own errors ("expects grads as a single
         * mutable list", missing ctx, ...). */
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *ctx = argv[0];
    PyObject *grads = argv[1];
    PyObject *saved = NULL, *symints = NULL, *opaque = NULL, *all_args = NULL;
    PyObject *result = NULL, *impl_fn = NULL, *cc = NULL;

    saved = PyObject_GetAttr(ctx, st->str_saved_tensors);
    if (saved == NULL) {
        goto done;
    }
    if (self->has_no_vc_check) {
        PyObject *no_vc = PyObject_GetAttr(ctx, st->str_tensors_no_vc_check);
        PyObject *both = no_vc ? PySequence_List(saved) : NULL;
        if (both == NULL || extend(both, no_vc) < 0) {
            Py_XDECREF(no_vc);
            Py_XDECREF(both);
            goto done;
        }
        Py_DECREF(no_vc);
        Py_SETREF(saved, both);
    }
    if ((symints = PyObject_GetAttr(ctx, st->str_symints)) == NULL ||
        (opaque = PyObject_GetAttr(ctx, st->str_opaque_objects)) == NULL) {
        goto done;
    }
    all_args = backward_prologue(self, saved, symints, opaque, grads);
    Py_CLEAR(saved); /* del _saved */
    if (all_args == NULL) {
        goto done;
    }
    if (self->rng_add != NULL) {
        PyObject *cargs[2] = {ctx, all_args};
        PyObject *r = PyObject_Vectorcall(self->rng_add, cargs, 2, NULL);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    /* The TLS `context` hook and the double-backward guard need impl_fn as
     * a Python callable; the common path calls the implementation directly. */
    PyObject *key = st->str_context;
    PyObject *r = PyObject_Vectorcall(st->is_key_in_tls, &key, 1, NULL);
    int has_key = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (has_key < 0) {
        goto done;
    }
    if (has_key) {
        cc = PyObject_Vectorcall(st->get_obj_in_tls, &key, 1, NULL);
        if (cc == NULL) {
            goto done;
        }
        if (cc == Py_None) {
            Py_CLEAR(cc);
        }
    }
    int grad = rt_grad_enabled(st);
    if (grad < 0) {
        goto done;
    }
    int need_double = grad;
    if (grad && !self->inputs_require_grad) {
        need_double = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all_args) && !need_double; i++) {
            PyObject *t = PyList_GET_ITEM(all_args, i);
            int is_tensor = rt_is_tensor(st, t);
            if (is_tensor < 0) {
                goto done;
            }
            if (is_tensor) {
                Py_INCREF(t);
                need_double = rt_tensor_requires_grad(st, t);
                Py_DECREF(t);
                if (need_double < 0) {
                    goto done;
                }
            }
        }
    }
    if (cc == NULL && !need_double) {
        result = backward_impl(self, ctx, all_args);
        goto done;
    }
    impl_fn = thunk_new(self, ctx, all_args);
    if (impl_fn == NULL) {
        goto done;
    }
    if (cc != NULL && !need_double) {
        /* functools.partial(cc.run, impl_fn)() is cc.run(impl_fn) */
        PyObject *cargs[2] = {cc, impl_fn};
        result = PyObject_VectorcallMethod(st->str_run, cargs, 2, NULL);
        goto done;
    }
    if (cc != NULL) {
        /* impl_fn = functools.partial(cc.run, impl_fn) */
        PyObject *run = PyObject_GetAttr(cc, st->str_run);
        if (run == NULL) {
            goto done;
        }
        PyObject *pargs[2] = {run, impl_fn};
        PyObject *wrapped = PyObject_Vectorcall(st->partial, pargs, 2, NULL);
        Py_DECREF(run);
        if (wrapped == NULL) {
            goto done;
        }
        Py_SETREF(impl_fn, wrapped);
    }
    if (need_double) {
        PyObject *dargs[3] = {ctx, impl_fn, all_args};
        result = PyObject_Vectorcall(self->double_backward, dargs, 3, NULL);
    }
    else {
        result = PyObject_CallNoArgs(impl_fn);
    }
done:
    Py_XDECREF(saved);
    Py_XDECREF(symints);
    Py_XDECREF(opaque);
    Py_XDECREF(all_args);
    Py_XDECREF(impl_fn);
    Py_XDECREF(cc);
    return result;
}

static int
parse_tangents(CompiledBackward *self, PyObject *kwargs)
{
    PyObject *v = rt_plan_required(kwargs, "tangents");
    if (v == NULL) {
        return -1;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != self->n_surviving) {
        PyErr_Format(PyExc_ValueError, "plan: tangents must be a tuple of %zd entries",
                     self->n_surviving);
        return -1;
    }
    self->tangents = PyMem_Calloc(self->n_surviving ? self->n_surviving : 1,
                                  sizeof(tangent_plan));
    if (self->tangents == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        PyObject *rec = PyTuple_GET_ITEM(v, j);
        tangent_plan *t = &self->tangents[j];
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 8 ||
            !PyLong_Check(PyTuple_GET_ITEM(rec, 0))) {
            PyErr_Format(PyExc_ValueError, "plan: tangents[%zd] must be an 8-tuple", j);
            return -1;
        }
        t->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(rec, 0));
        if (t->kind < TANGENT_STRIDES || t->kind > TANGENT_PYTHON) {
            PyErr_Format(PyExc_ValueError, "plan: tangents[%zd] has unknown kind", j);
            return -1;
        }
        t->meta = Py_NewRef(PyTuple_GET_ITEM(rec, 1));
        t->memory_format_meta = Py_NewRef(PyTuple_GET_ITEM(rec, 2));
        t->size = Py_NewRef(PyTuple_GET_ITEM(rec, 3));
        t->stride = Py_NewRef(PyTuple_GET_ITEM(rec, 4));
        t->memory_format = Py_NewRef(PyTuple_GET_ITEM(rec, 5));
        t->desc = Py_NewRef(PyTuple_GET_ITEM(rec, 6));
        t->stack_trace = Py_NewRef(PyTuple_GET_ITEM(rec, 7));
        if ((t->index = PyLong_FromSsize_t(j)) == NULL) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
CompiledBackward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "CompiledBackward takes keyword arguments only");
        return NULL;
    }
    CompiledBackward *self = (CompiledBackward *)fn_alloc(type, CompiledBackward_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    int err = 0;
    PyObject *v;
    bool b[7];
    if ((self->upstream = callable_or_null(kwargs, "upstream", &err)) == NULL) {
        if (!err) {
            PyErr_SetString(PyExc_ValueError, "plan: upstream must be callable");
        }
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "cls")) == NULL) {
        goto fail;
    }
    self->cls = Py_NewRef(v);
    if ((self->double_backward = PyObject_GetAttrString(v, "_double_backward")) == NULL) {
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "backward_compiler")) == NULL) {
        goto fail;
    }
    self->backward_compiler = Py_NewRef(v);
    if ((v = rt_plan_required(kwargs, "fw_metadata")) == NULL) {
        goto fail;
    }
    self->fw_metadata = Py_NewRef(v);
    if ((v = rt_plan_required(kwargs, "compile_id")) == NULL) {
        goto fail;
    }
    self->compile_id = Py_NewRef(v);
    self->rng_add = callable_or_null(kwargs, "rng_add_backward_args", &err);
    if (err || rt_plan_bool(kwargs, "disable_amp", &b[0]) < 0 ||
        rt_plan_bool(kwargs, "has_backward_state", &b[1]) < 0 ||
        rt_plan_bool(kwargs, "check_deterministic", &b[2]) < 0 ||
        rt_plan_bool(kwargs, "has_mutations_in_bw", &b[3]) < 0 ||
        rt_plan_bool(kwargs, "inputs_require_grad", &b[4]) < 0 ||
        rt_plan_bool(kwargs, "has_no_vc_check", &b[5]) < 0 ||
        (v = rt_plan_required(kwargs, "expected_grad_outs")) == NULL ||
        index_or_none(v, "expected_grad_outs", &self->expected_grad_outs) < 0 ||
        (v = rt_plan_required(kwargs, "num_backward_tokens")) == NULL ||
        index_or_none(v, "num_backward_tokens", &self->num_backward_tokens) < 0 ||
        rt_plan_indices(kwargs, "surviving", &self->n_surviving, &self->surviving) < 0) {
        goto fail;
    }
    self->disable_amp = b[0];
    self->has_backward_state = b[1];
    self->check_deterministic = b[2];
    self->has_mutations_in_bw = b[3];
    self->inputs_require_grad = b[4];
    self->has_no_vc_check = b[5];
    if (self->expected_grad_outs < 0 || self->num_backward_tokens < 0) {
        PyErr_SetString(PyExc_ValueError, "plan: grad counts must be ints");
        goto fail;
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        if (self->surviving[j] >= self->expected_grad_outs) {
            PyErr_Format(PyExc_ValueError, "plan: surviving grad %zd is not in [0, %zd)",
                         self->surviving[j], self->expected_grad_outs);
            goto fail;
        }
    }
    if (parse_tangents(self, kwargs) < 0) {
        goto fail;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
CompiledBackward_traverse(CompiledBackward *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->cls);
    Py_VISIT(self->double_backward);
    Py_VISIT(self->backward_compiler);
    Py_VISIT(self->fw_metadata);
    Py_VISIT(self->rng_add);
    Py_VISIT(self->compile_id);
    Py_VISIT(self->compiled_bw);
    if (self->tangents) {
        for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
            tangent_plan *t = &self->tangents[j];
            Py_VISIT(t->meta);
            Py_VISIT(t->memory_format_meta);
            Py_VISIT(t->size);
            Py_VISIT(t->stride);
            Py_VISIT(t->memory_format);
            Py_VISIT(t->desc);
            Py_VISIT(t->stack_trace);
        }
    }
    return 0;
}

static int
CompiledBackward_clear(CompiledBackward *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->cls);
    Py_CLEAR(self->double_backward);
    Py_CLEAR(self->backward_compiler);
    Py_CLEAR(self->fw_metadata);
    Py_CLEAR(self->rng_add);
    Py_CLEAR(self->compile_id);
    Py_CLEAR(self->compiled_bw);
    if (self->tangents) {
        for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
            tangent_plan *t = &self->tangents[j];
            Py_CLEAR(t->meta);
            Py_CLEAR(t->memory_format_meta);
            Py_CLEAR(t->size);
            Py_CLEAR(t->stride);
            Py_CLEAR(t->memory_format);
            Py_CLEAR(t->desc);
            Py_CLEAR(t->stack_trace);
            Py_CLEAR(t->index);
        }
    }
    return 0;
}

static void
CompiledBackward_free_arrays(CompiledBackward *self)
{
    PyMem_Free(self->surviving);
    PyMem_Free(self->tangents);
}

/* ---- BackwardThunk: impl_fn(double_ctx=None) ---------------------------- */

static PyObject *
BackwardThunk_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                         PyObject *kwnames)
{
    BackwardThunk *self = (BackwardThunk *)op;
    (void)argv; /* double_ctx is accepted and unused, as upstream's impl_fn */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1 ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0),
                                                      "double_ctx") != 0)) {
        PyErr_SetString(PyExc_TypeError, "impl_fn() takes one optional argument, double_ctx");
        return NULL;
    }
    return backward_impl((CompiledBackward *)self->backward, self->ctx, self->all_args);
}

static PyObject *
thunk_new(CompiledBackward *backward, PyObject *ctx, PyObject *all_args)
{
    PyTypeObject *type = backward->st->BackwardThunkType;
    BackwardThunk *self = (BackwardThunk *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = BackwardThunk_vectorcall;
    self->backward = Py_NewRef((PyObject *)backward);
    self->ctx = Py_NewRef(ctx);
    self->all_args = Py_NewRef(all_args);
    return (PyObject *)self;
}

static int
BackwardThunk_traverse(BackwardThunk *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->backward);
    Py_VISIT(self->ctx);
    Py_VISIT(self->all_args);
    return 0;
}

static int
BackwardThunk_clear(BackwardThunk *self)
{
    Py_CLEAR(self->backward);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->all_args);
    return 0;
}

/* ---- type boilerplate --------------------------------------------------- */

#define DEFINE_DEALLOC(Type, extra)                                          \
    static void Type##_dealloc(Type *self)                                   \
    {                                                                        \
        PyTypeObject *tp = Py_TYPE(self);                                    \
        PyObject_GC_UnTrack(self);                                           \
        if (self->weakreflist != NULL) {                                     \
            PyObject_ClearWeakRefs((PyObject *)self);                        \
        }                                                                    \
        Type##_clear(self);                                                  \
        extra;                                                               \
        Py_CLEAR(self->module);                                              \
        tp->tp_free(self);                                                   \
        Py_DECREF(tp);                                                       \
    }

DEFINE_DEALLOC(FunctionApply, (void)0)
DEFINE_DEALLOC(CompiledForward, CompiledForward_free_arrays(self))
DEFINE_DEALLOC(CompiledBackward, CompiledBackward_free_arrays(self))

static void
BackwardThunk_dealloc(BackwardThunk *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    BackwardThunk_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

#define FN_MEMBERS(Type)                                                     \
    static PyMemberDef Type##_members[] = {                                  \
        {"__vectorcalloffset__", T_PYSSIZET, offsetof(Type, vectorcall), READONLY, NULL}, \
        {"__dictoffset__", T_PYSSIZET, offsetof(Type, dict), READONLY, NULL}, \
        {"__weaklistoffset__", T_PYSSIZET, offsetof(Type, weakreflist), READONLY, NULL}, \
        {NULL, 0, 0, 0, NULL},                                               \
    };

FN_MEMBERS(FunctionApply)
FN_MEMBERS(CompiledForward)
FN_MEMBERS(CompiledBackward)

static PyMemberDef BackwardThunk_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(BackwardThunk, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef fn_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define FN_SPEC(Type, doc)                                      \
    static PyType_Slot Type##_slots[] = {                                    \
        {Py_tp_new, Type##_new},                                             \
        {Py_tp_dealloc, Type##_dealloc},                                     \
        {Py_tp_traverse, Type##_traverse},                                   \
        {Py_tp_clear, Type##_clear},                                         \
        {Py_tp_call, PyVectorcall_Call},                                     \
        {Py_tp_members, Type##_members},                                     \
        {Py_tp_getset, fn_getset},                                           \
        {Py_tp_doc, (void *)doc},                                            \
        {0, NULL},                                                           \
    };                                                                       \
    static PyType_Spec Type##_spec = {                                       \
        .name = "torch_aot_rt._C." #Type,                                    \
        .basicsize = sizeof(Type),                                           \
        .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |                   \
                 Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_IMMUTABLETYPE,      \
        .slots = Type##_slots,                                               \
    };

FN_SPEC(FunctionApply,
        "FunctionApply(cls): CompiledFunction.apply, boxed (called with the args list).")
FN_SPEC(CompiledForward, "CompiledFunction.forward(ctx, *args) in C (keyword plan).")
FN_SPEC(CompiledBackward, "CompiledFunction.backward(ctx, grads) in C (keyword plan).")

static PyType_Slot BackwardThunk_slots[] = {
    {Py_tp_dealloc, BackwardThunk_dealloc},
    {Py_tp_traverse, BackwardThunk_traverse},
    {Py_tp_clear, BackwardThunk_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, BackwardThunk_members},
    {Py_tp_doc, (void *)"impl_fn(double_ctx=None) of one CompiledFunction backward."},
    {0, NULL},
};

static PyType_Spec BackwardThunk_spec = {
    .name = "torch_aot_rt._C.BackwardThunk",
    .basicsize = sizeof(BackwardThunk),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = BackwardThunk_slots,
};

int
rt_autograd_types_init(PyObject *module, rt_state *st)
{
    struct {
        PyType_Spec *spec;
        PyTypeObject **slot;
    } types[] = {
        {&FunctionApply_spec, &st->FunctionApplyType},
        {&CompiledForward_spec, &st->CompiledForwardType},
        {&CompiledBackward_spec, &st->CompiledBackwardType},
        {&BackwardThunk_spec, &st->BackwardThunkType},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, types[i].spec, NULL);
        if (*types[i].slot == NULL || PyModule_AddType(module, *types[i].slot) < 0) {
            return -1;
        }
    }
    return 0;
}
