/* subclass_wrapper.c: SubclassWrapper, AOTDispatchSubclassWrapper's per-call
 * wrapper, in C.
 *
 * Upstream's AOTDispatchSubclassWrapper.post_compile (runtime_wrappers.py)
 * generates, per graph, a Python function (subclass_codegen.py:
 * codegen_subclass_wrapper / _codegen_subclass_wrapper_source) that
 *   - unwraps each tensor-subclass input into its inner tensors, reading the
 *     attributes __tensor_flatten__ named at compile time (recursively), after
 *     `assert type(x) is T`, and appends the symbolic sizes/strides the graph
 *     takes as inputs (x.size()[i], x.stride()[i]);
 *   - passes plain inputs, None for inductor-frozen ones, and any trailing
 *     arguments through; clears the caller's list;
 *   - calls the compiled graph on the flat list;
 *   - rebuilds each subclass output with T.__tensor_unflatten__(inner dict,
 *     meta, outer_size, outer_stride), its sizes made of constants and of
 *     SymInt outputs of the graph;
 *   - returns the outputs as a tuple, followed (training) by the activations
 *     saved for backward.
 * torch_aot_rt/_subclass_wrapper.py walks the same metadata upstream's codegen walks
 * and writes, instead of source, a small program: instructions over numbered
 * registers (the generated function's locals). This file validates the
 * program once, at construction (ValueError naming what is malformed: a
 * register read before it is written, an unknown op, ...), and runs it per
 * call. Every call into Python that the generated function makes (attribute
 * reads on the subclass, size()/stride(), __tensor_unflatten__, indexing the
 * outputs, the compiled graph) is made here too, in the same order; the
 * rest (the flat list, the dict, the tuples, the counts and their
 * assertions) is C.
 *
 * What differs between releases is in the program (torch_aot_rt/_versions.py
 * Release.subclass_outputs_by_cursor): 2.13 reads the graph's outputs at
 * indices fixed at build time and returns the activations from the tally of
 * wrapped outputs on; 2.14 reads them with a running index, skips optional
 * SymInt outputs, asserts the counts, and returns the activations counted
 * from the end. Both are instructions and plan fields here; nothing in this
 * file asks for a version.
 *
 * Where this differs from the generated function on purpose: in 2.13 the
 * generated code reads `unwrapped_outs[i]` of a subclass's outer size inline,
 * after looking up __tensor_unflatten__ on the type; here the read comes
 * first. Both are reads of the graph's output list, which has no behaviour
 * of its own.
 * ====================================================================== */
#include "aot/wrappers/subclass_program.h"

#include <string.h>


typedef struct {
    RT_FN_HEAD
    PyObject *compiled_fn;
    Py_ssize_t n_inputs;       /* len(inp_metas): args[n_inputs:] pass through */
    Py_ssize_t n_regs;
    Py_ssize_t n_appends;      /* items the unwrap program appends */
    sc_program unwrap;
    sc_program wrap;
    Py_ssize_t n_results;
    Py_ssize_t *results;       /* registers of the returned outputs */
    /* 2.14 (cursor): _num_wrapped_outs = len(outs) - saved, its assertions */
    bool cursor;
    Py_ssize_t saved;
    Py_ssize_t count_min, count_max;  /* -1: no count assertion */
    bool final_check;
    int tail;                  /* enum sc_tail */
    Py_ssize_t tail_n;         /* its start, or its length from the end */
    bool asserts;              /* the generated function's asserts (not python -O) */
    /* codegen_backward_subclass_fns' wrap_fn(unwrapped_outs): the argument is
     * the backward's grads, wrapped by the program; no unwrap, no call */
    bool wrap_only;
} SubclassWrapper;

/* ---- per call -------------------------------------------------------- */

/* args[i] (the generated function's `args[i]`) */
static PyObject *
sc_item(PyObject *seq, Py_ssize_t i)
{
    if (PyList_CheckExact(seq)) {
        if (i < PyList_GET_SIZE(seq)) {
            return Py_NewRef(PyList_GET_ITEM(seq, i));
        }
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return NULL;
    }
    if (PyTuple_CheckExact(seq)) {
        if (i < PyTuple_GET_SIZE(seq)) {
            return Py_NewRef(PyTuple_GET_ITEM(seq, i));
        }
        PyErr_SetString(PyExc_IndexError, "tuple index out of range");
        return NULL;
    }
    PyObject *key = PyLong_FromSsize_t(i);
    if (key == NULL) {
        return NULL;
    }
    PyObject *v = PyObject_GetItem(seq, key);
    Py_DECREF(key);
    return v;
}

/* seq[start:] (the generated `args[n:]`, `unwrapped_outs[k:]`), with
 * Python's meaning of a negative start */
static PyObject *
sc_slice_from(PyObject *seq, Py_ssize_t start)
{
    if (PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) {
        Py_ssize_t len = Py_SIZE(seq);
        if (start < 0) {
            start = start + len < 0 ? 0 : start + len;
        }
        if (start > len) {
            start = len;
        }
        return PyList_CheckExact(seq) ? PyList_GetSlice(seq, start, len)
                                      : PyTuple_GetSlice(seq, start, len);
    }
    PyObject *lo = PyLong_FromSsize_t(start);
    if (lo == NULL) {
        return NULL;
    }
    PyObject *slice = PySlice_New(lo, NULL, NULL);
    Py_DECREF(lo);
    if (slice == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_GetItem(seq, slice);
    Py_DECREF(slice);
    return out;
}

static PyObject *
sc_assertion(const char *message)
{
    PyErr_SetString(PyExc_AssertionError, message);
    return NULL;
}

/* `assert type(x) is T, f'expected {T}, got {type(x)}'` */
static int
sc_type_error(PyObject *expected, PyObject *x)
{
    PyObject *empty = PyUnicode_New(0, 0);
    PyObject *a = empty ? PyObject_Format(expected, empty) : NULL;
    PyObject *b = a ? PyObject_Format((PyObject *)Py_TYPE(x), empty) : NULL;
    if (b != NULL) {
        PyObject *msg = PyUnicode_FromFormat("expected %U, got %U", a, b);
        if (msg != NULL) {
            PyErr_SetObject(PyExc_AssertionError, msg);
            Py_DECREF(msg);
        }
    }
    Py_XDECREF(empty);
    Py_XDECREF(a);
    Py_XDECREF(b);
    return -1;
}

/* s = x.size() (or stride()); append s[i] for i in idx */
static int
sc_append_dims(SubclassWrapper *self, const sc_instr *in, PyObject *x, PyObject *flat,
               Py_ssize_t *k)
{
    PyObject *owner = NULL;
    if (in->obj != NULL) {  /* 2.14's `var.attr.size()`: the attribute read again */
        owner = PyObject_GetAttr(x, in->obj);
        if (owner == NULL) {
            return -1;
        }
        x = owner;
    }
    PyObject *dims = rt_tensor_call(self->st, in->op == SC_SIZE ? RT_SIZE : RT_STRIDE, x,
                                    NULL, 0);
    Py_XDECREF(owner);
    if (dims == NULL) {
        return -1;
    }
    for (Py_ssize_t j = 0; j < in->n; j++) {
        PyObject *v = PySequence_GetItem(dims, in->idx[j]);
        if (v == NULL) {
            Py_DECREF(dims);
            return -1;
        }
        PyList_SET_ITEM(flat, (*k)++, v);
    }
    Py_DECREF(dims);
    return 0;
}

static int
sc_run_unwrap(SubclassWrapper *self, PyObject *args, PyObject **r, PyObject *flat)
{
    Py_ssize_t k = 0;
    for (Py_ssize_t pc = 0; pc < self->unwrap.n; pc++) {
        const sc_instr *in = &self->unwrap.code[pc];
        PyObject *v;
        switch (in->op) {
        case SC_ARG:
            if ((v = sc_item(args, in->a)) == NULL) {
                return -1;
            }
            PyList_SET_ITEM(flat, k++, v);
            break;
        case SC_NONE:
            PyList_SET_ITEM(flat, k++, Py_NewRef(Py_None));
            break;
        case SC_LOAD_CHECKED:
            if ((v = sc_item(args, in->b)) == NULL) {
                return -1;
            }
            Py_XSETREF(r[in->a], v);
            if (self->asserts && (PyObject *)Py_TYPE(v) != in->obj) {
                return sc_type_error(in->obj, v);
            }
            break;
        case SC_GETATTR:
            if ((v = PyObject_GetAttr(r[in->b], in->obj)) == NULL) {
                return -1;
            }
            Py_XSETREF(r[in->a], v);
            break;
        case SC_APPEND_ATTR:
            if ((v = PyObject_GetAttr(r[in->b], in->obj)) == NULL) {
                return -1;
            }
            PyList_SET_ITEM(flat, k++, v);
            break;
        case SC_APPEND:
            PyList_SET_ITEM(flat, k++, Py_NewRef(r[in->a]));
            break;
        case SC_SIZE:
        case SC_STRIDE:
            if (sc_append_dims(self, in, r[in->a], flat, &k) < 0) {
                return -1;
            }
            break;
        default:  /* rejected at construction */
            PyErr_SetString(PyExc_SystemError, "SubclassWrapper: bad unwrap instruction");
            return -1;
        }
    }
    return 0;
}

/* _emit_optional_symint_skip's generated statements:
 *   _remaining = _num_wrapped_outs - _out_idx
 *   _include = (later_min <= _remaining - 1 <= later_max) and _is_optional_symint_output(outs[_out_idx])
 *   assert _include or (later_min <= _remaining <= later_max), '...'
 *   if _include: _out_idx += 1 */
static int
sc_optional_skip(SubclassWrapper *self, const sc_instr *in, PyObject *outs, Py_ssize_t n_wrapped,
                 Py_ssize_t *cursor)
{
    Py_ssize_t remaining = n_wrapped - *cursor;
    int include = 0;
    if (remaining - 1 >= in->a && remaining - 1 <= in->b) {
        PyObject *v = sc_item(outs, *cursor);
        if (v == NULL) {
            return -1;
        }
        /* isinstance(x, (int, SymInt)) */
        include = PyLong_Check(v);
        if (!include) {
            include = PyObject_IsInstance(v, self->st->aot.obj.SymInt);
        }
        Py_DECREF(v);
        if (include < 0) {
            return -1;
        }
    }
    if (self->asserts && !include && !(remaining >= in->a && remaining <= in->b)) {
        sc_assertion("could not match output layout with optional SymInt outputs");
        return -1;
    }
    if (include) {
        (*cursor)++;
    }
    return 0;
}

static PyObject *
sc_unflatten(SubclassWrapper *self, const sc_instr *in, PyObject **r)
{
    /* `T.__tensor_unflatten__(inner, meta, size, stride)`: the method looked
     * up on the type first, then the arguments in order */
    PyObject *fn = PyObject_GetAttr(in->obj, self->st->aot.obj.str_tensor_unflatten);
    if (fn == NULL) {
        return NULL;
    }
    PyObject *size = in->idx[0] ? rt_tensor_call(self->st, RT_SIZE, r[in->c], NULL, 0)
                                : Py_NewRef(r[in->c]);
    PyObject *stride = NULL;
    if (size != NULL) {
        stride = in->idx[1] ? rt_tensor_call(self->st, RT_STRIDE, r[in->d], NULL, 0)
                            : Py_NewRef(r[in->d]);
    }
    PyObject *out = NULL;
    if (stride != NULL) {
        PyObject *argv[4] = {r[in->b], in->obj2, size, stride};
        out = PyObject_Vectorcall(fn, argv, 4, NULL);
    }
    Py_DECREF(fn);
    Py_XDECREF(size);
    Py_XDECREF(stride);
    return out;
}

static int
sc_run_wrap(SubclassWrapper *self, PyObject *outs, Py_ssize_t n_wrapped, PyObject **r,
            Py_ssize_t *cursor)
{
    for (Py_ssize_t pc = 0; pc < self->wrap.n; pc++) {
        const sc_instr *in = &self->wrap.code[pc];
        PyObject *v = NULL;
        switch (in->op) {
        case SC_OUT:
            if (in->b >= 0) {
                v = sc_item(outs, in->b);
            }
            else if ((v = sc_item(outs, *cursor)) != NULL) {
                (*cursor)++;
            }
            break;
        case SC_OPT_SKIP:
            if (sc_optional_skip(self, in, outs, n_wrapped, cursor) < 0) {
                return -1;
            }
            continue;
        case SC_DICT:
            if ((v = PyDict_New()) == NULL) {
                return -1;
            }
            for (Py_ssize_t j = 0; j < in->n; j++) {
                if (PyDict_SetItem(v, PyTuple_GET_ITEM(in->obj, j), r[in->idx[j]]) < 0) {
                    Py_DECREF(v);
                    return -1;
                }
            }
            break;
        case SC_TUPLE:
            if (in->c) {
                /* no item from a register: the generated source's `(8, 1)`,
                 * a constant the compiler folded, the same tuple every call */
                v = Py_NewRef(in->obj);
                break;
            }
            if ((v = PyTuple_New(in->n)) == NULL) {
                return -1;
            }
            for (Py_ssize_t j = 0; j < in->n; j++) {
                PyObject *item = in->idx[j] >= 0 ? r[in->idx[j]] : PyTuple_GET_ITEM(in->obj, j);
                PyTuple_SET_ITEM(v, j, Py_NewRef(item));
            }
            break;
        case SC_UNFLATTEN:
            v = sc_unflatten(self, in, r);
            break;
        default:
            PyErr_SetString(PyExc_SystemError, "SubclassWrapper: bad wrap instruction");
            return -1;
        }
        if (v == NULL) {
            return -1;
        }
        Py_XSETREF(r[in->a], v);
    }
    return 0;
}

static Py_ssize_t
sc_length(PyObject *outs)
{
    if (PyList_CheckExact(outs)) {
        return PyList_GET_SIZE(outs);
    }
    if (PyTuple_CheckExact(outs)) {
        return PyTuple_GET_SIZE(outs);
    }
    return PyObject_Size(outs);
}

/* (outputs...,) [+ tuple(outs[start:])] */
static PyObject *
sc_result(SubclassWrapper *self, PyObject *outs, PyObject **r)
{
    PyObject *tail = NULL;
    Py_ssize_t n_tail = 0;
    if (self->tail != SC_TAIL_NONE) {
        Py_ssize_t start = self->tail_n;
        if (self->tail == SC_TAIL_FROM_END) {  /* len(outs) - num_fw_outs_saved_for_bw */
            Py_ssize_t len = sc_length(outs);
            if (len < 0) {
                return NULL;
            }
            start = len - self->tail_n;
        }
        PyObject *slice = sc_slice_from(outs, start);
        if (slice == NULL) {
            return NULL;
        }
        tail = PySequence_Tuple(slice);
        Py_DECREF(slice);
        if (tail == NULL) {
            return NULL;
        }
        n_tail = PyTuple_GET_SIZE(tail);
    }
    PyObject *result = PyTuple_New(self->n_results + n_tail);
    if (result != NULL) {
        for (Py_ssize_t j = 0; j < self->n_results; j++) {
            PyTuple_SET_ITEM(result, j, Py_NewRef(r[self->results[j]]));
        }
        for (Py_ssize_t j = 0; j < n_tail; j++) {
            PyTuple_SET_ITEM(result, self->n_results + j, Py_NewRef(PyTuple_GET_ITEM(tail, j)));
        }
    }
    Py_XDECREF(tail);
    return result;
}

/* args.clear() */
static int
sc_clear_args(SubclassWrapper *self, PyObject *args)
{
    if (PyList_CheckExact(args)) {
        return PyList_SetSlice(args, 0, PyList_GET_SIZE(args), NULL);
    }
    PyObject *res = PyObject_CallMethodNoArgs(args, self->st->aot.obj.str_clear);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

/* unwrapped_args.extend(args[n_inputs:]) */
static int
sc_extend_tail(SubclassWrapper *self, PyObject *args, PyObject *flat)
{
    if (PyList_CheckExact(args) && PyList_GET_SIZE(args) <= self->n_inputs) {
        return 0;
    }
    PyObject *tail = sc_slice_from(args, self->n_inputs);
    if (tail == NULL) {
        return -1;
    }
    int rc = 0;
    if (!PyList_CheckExact(tail)) {
        /* list.extend of any iterable */
        Py_SETREF(tail, PySequence_List(tail));
        if (tail == NULL) {
            return -1;
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(flat);
    rc = PyList_SetSlice(flat, n, n, tail);
    Py_DECREF(tail);
    return rc;
}

/* The argument errors of the generated `def inner_fn(args)`, in the order
 * CPython checks them (keywords, then the positional count, then what is
 * missing), named as CPython names the function in them: by its
 * __qualname__, which update_wrapper set to the compiled function's.
 * Returns -1 with the error set, or 0 for the one valid call with
 * keywords, inner_fn(args=x). */
static int
sc_signature_error(PyObject *self, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    bool have = nargs >= 1;
    const char *what = NULL;
    PyObject *kw = NULL;
    for (Py_ssize_t i = 0; i < nkw && what == NULL; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "args") != 0) {
            what = "%U() got an unexpected keyword argument '%U'";
            kw = name;
        }
        else if (have) {
            what = "%U() got multiple values for argument 'args'";
        }
        have = true;
    }
    if (what == NULL && nargs > 1) {
        what = "%U() takes 1 positional argument but %zd were given";
    }
    if (what == NULL && !have) {
        what = "%U() missing 1 required positional argument: 'args'";
    }
    if (what == NULL) {
        return 0;
    }
    PyObject *qualname = PyObject_GetAttrString(self, "__qualname__");
    if (qualname != NULL && !PyUnicode_Check(qualname)) {
        Py_CLEAR(qualname);
    }
    if (qualname == NULL) {
        PyErr_Clear();
        qualname = PyUnicode_FromString("inner_fn");
        if (qualname == NULL) {
            return -1;
        }
    }
    if (kw != NULL) {
        PyErr_Format(PyExc_TypeError, what, qualname, kw);
    }
    else if (nargs > 1 && strstr(what, "takes") != NULL) {
        PyErr_Format(PyExc_TypeError, what, qualname, nargs);
    }
    else {
        PyErr_Format(PyExc_TypeError, what, qualname);
    }
    Py_DECREF(qualname);
    return -1;
}

static PyObject *
SubclassWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                           PyObject *kwnames)
{
    SubclassWrapper *self = (SubclassWrapper *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *args;
    if (self->compiled_fn == NULL) {  /* cleared by the GC, then reached again */
        PyErr_SetString(PyExc_RuntimeError, "SubclassWrapper: called after being cleared");
        return NULL;
    }
    if (nargs == 1 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
        args = argv[0];
    }
    else if (sc_signature_error(op, nargs, kwnames) < 0) {
        return NULL;
    }
    else {
        args = argv[0];  /* inner_fn(args=x) */
    }
    PyObject *stack_regs[RT_STACK_ARGS];
    PyObject **r = stack_regs;
    bool wrap_only = self->wrap_only;
    if (self->n_regs > RT_STACK_ARGS) {
        r = PyMem_Calloc((size_t)self->n_regs, sizeof(PyObject *));
        if (r == NULL) {
            return PyErr_NoMemory();
        }
    }
    else {
        memset(stack_regs, 0, sizeof(stack_regs));
    }
    PyObject *result = NULL, *outs = NULL, *flat = NULL;
    Py_INCREF(args);  /* the caller's list, held as the generated frame holds it */
    if (wrap_only) {
        outs = Py_NewRef(args);
    }
    else {
        flat = PyList_New(self->n_appends);
        if (flat == NULL || sc_run_unwrap(self, args, r, flat) < 0 ||
            sc_extend_tail(self, args, flat) < 0 || sc_clear_args(self, args) < 0) {
            goto done;
        }
        /* unwrapped_outs = compiled_fn(unwrapped_args); the list stays alive
         * (a local of the generated function) until the call returns */
        outs = PyObject_Vectorcall(self->compiled_fn, &flat, 1, NULL);
        if (outs == NULL) {
            goto done;
        }
    }
    Py_ssize_t cursor = 0, n_wrapped = 0;
    if (self->cursor) {
        /* _num_wrapped_outs = len(unwrapped_outs) - saved_for_bw */
        Py_ssize_t len = sc_length(outs);
        if (len < 0) {
            goto done;
        }
        n_wrapped = len - self->saved;
        if (self->asserts && self->count_min >= 0) {
            if (self->count_min == self->count_max && n_wrapped != self->count_max) {
                PyErr_Format(PyExc_AssertionError, "expected %zd wrapped outputs, got %zd",
                             self->count_max, n_wrapped);
                goto done;
            }
            if (n_wrapped < self->count_min || n_wrapped > self->count_max) {
                PyErr_Format(PyExc_AssertionError,
                             "expected between %zd and %zd wrapped outputs, got %zd",
                             self->count_min, self->count_max, n_wrapped);
                goto done;
            }
        }
    }
    if (sc_run_wrap(self, outs, n_wrapped, r, &cursor) < 0) {
        goto done;
    }
    if (self->cursor && self->asserts && self->final_check && cursor != n_wrapped) {
        PyErr_Format(PyExc_AssertionError, "wrapped %zd outputs, expected %zd", cursor,
                     n_wrapped);
        goto done;
    }
    result = sc_result(self, outs, r);
done:
    Py_XDECREF(outs);
    Py_XDECREF(flat);
    Py_DECREF(args);
    for (Py_ssize_t i = 0; i < self->n_regs; i++) {
        Py_XDECREF(r[i]);
    }
    if (r != stack_regs) {
        PyMem_Free(r);
    }
    return result;
}

static PyObject *
SubclassWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"compiled_fn", "n_inputs", "n_regs", "unwrap", "wrap", "results",
                               "cursor", "saved", "count_check", "final_check", "tail",
                               "tail_n", "asserts", "wrap_only", NULL};
    PyObject *compiled_fn, *unwrap, *wrap, *results, *count_check;
    Py_ssize_t n_inputs, n_regs, saved, tail_n;
    int cursor, final_check, tail, asserts, wrap_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O$nnO!O!O!pnOpinpp:SubclassWrapper",
                                     keywords, &compiled_fn, &n_inputs, &n_regs, &PyTuple_Type,
                                     &unwrap, &PyTuple_Type, &wrap, &PyTuple_Type, &results,
                                     &cursor, &saved, &count_check, &final_check, &tail,
                                     &tail_n, &asserts, &wrap_only)) {
        return NULL;
    }
    if (wrap_only ? compiled_fn != Py_None || PyTuple_GET_SIZE(unwrap) != 0 || n_inputs != 0
                  : !PyCallable_Check(compiled_fn)) {
        PyErr_SetString(PyExc_TypeError,
                        wrap_only ? "SubclassWrapper: wrap_only takes compiled_fn None and no "
                                    "inputs"
                                  : "SubclassWrapper: compiled_fn must be callable");
        return NULL;
    }
    if (n_inputs < 0 || n_regs < 0 || saved < 0 || tail_n < 0 || tail < SC_TAIL_NONE ||
        tail > SC_TAIL_FROM_END) {
        PyErr_SetString(PyExc_ValueError, "SubclassWrapper plan: negative count or bad tail");
        return NULL;
    }
    SubclassWrapper *self = (SubclassWrapper *)rt_fn_alloc(type, SubclassWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->n_inputs = n_inputs;
    self->n_regs = n_regs;
    self->cursor = cursor != 0;
    self->saved = saved;
    self->final_check = final_check != 0;
    self->tail = tail;
    self->tail_n = tail_n;
    self->asserts = asserts != 0;
    self->wrap_only = wrap_only != 0;
    self->count_min = self->count_max = -1;
    char *written = PyMem_Calloc(n_regs ? (size_t)n_regs : 1, 1);
    if (written == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t appends = 0;
    if (rt_sc_program_parse(unwrap, "unwrap", true, n_regs, n_inputs, written, &appends,
                         &self->unwrap) < 0 ||
        rt_sc_program_parse(wrap, "wrap", false, n_regs, n_inputs, written, &appends,
                         &self->wrap) < 0) {
        PyMem_Free(written);
        goto fail;
    }
    self->n_appends = appends;
    self->n_results = PyTuple_GET_SIZE(results);
    self->results = PyMem_Calloc(self->n_results ? (size_t)self->n_results : 1,
                                 sizeof(Py_ssize_t));
    if (self->results == NULL) {
        PyErr_NoMemory();
        PyMem_Free(written);
        goto fail;
    }
    for (Py_ssize_t j = 0; j < self->n_results; j++) {
        if (rt_sc_ssize(PyTuple_GET_ITEM(results, j), &self->results[j]) < 0 ||
            !rt_sc_reg(self->results[j], n_regs, written, true)) {
            PyErr_SetString(PyExc_ValueError,
                            "SubclassWrapper plan: results must be written registers");
            PyMem_Free(written);
            goto fail;
        }
    }
    PyMem_Free(written);
    if (count_check != Py_None) {
        if (!PyTuple_Check(count_check) || PyTuple_GET_SIZE(count_check) != 2 ||
            rt_sc_ssize(PyTuple_GET_ITEM(count_check, 0), &self->count_min) < 0 ||
            rt_sc_ssize(PyTuple_GET_ITEM(count_check, 1), &self->count_max) < 0 ||
            self->count_min < 0 || self->count_max < self->count_min || !self->cursor) {
            PyErr_SetString(PyExc_ValueError,
                            "SubclassWrapper plan: count_check must be None or (min, max) "
                            "with cursor");
            goto fail;
        }
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
SubclassWrapper_traverse(SubclassWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->compiled_fn);
    int rc = rt_sc_program_traverse(&self->unwrap, visit, arg);
    return rc ? rc : rt_sc_program_traverse(&self->wrap, visit, arg);
}

static int
SubclassWrapper_clear(SubclassWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->compiled_fn);
    /* the programs' objects (types, metas, names) are cleared with them; a
     * cleared wrapper is never called again (tp_clear runs on garbage) */
    rt_sc_program_free(&self->unwrap);
    rt_sc_program_free(&self->wrap);
    return 0;
}

DEFINE_DEALLOC(SubclassWrapper, PyMem_Free(self->results))
FN_MEMBERS(SubclassWrapper)
FN_SPEC(SubclassWrapper,
        "SubclassWrapper(compiled_fn, *, n_inputs, n_regs, unwrap, wrap, results, cursor, "
        "saved, count_check, final_check, tail, tail_n, asserts, wrap_only): "
        "AOTDispatchSubclassWrapper's generated subclass wrapper in C.")
