/* params_prepend.c: ParamsPrepend, the `forward` that aot_module_simplified
 * returns, in C.
 *
 * aot_module_simplified (torch/_functorch/aot_autograd.py) returns one of two
 * closures over `compiled_fn` and `params_buffers_flat`, run on every call:
 *
 *     def forward(*runtime_args):            # an fx.GraphModule
 *         full_args = []
 *         full_args.extend(params_buffers_flat)
 *         full_args.extend(runtime_args)
 *         if compiled_fn is None: raise AssertionError(...)
 *         return compiled_fn(full_args)
 *
 *     def forward(runtime_args: list):       # a GmWrapper: boxed
 *         flat_args = []
 *         flat_args.extend(params_buffers_flat)
 *         flat_args.extend(runtime_args)
 *         runtime_args.clear()
 *         if compiled_fn is None: raise AssertionError(...)
 *         return compiled_fn(flat_args)
 *
 * ParamsPrepend(forward, boxed) holds that closure's two cells and reads them
 * per call, as the closure does (params_buffers_flat is the list Dynamo's
 * TracingContext.params_flat names: inductor's freezing empties entries of it
 * in place). Calls that are not the plain case (keyword arguments, a boxed
 * argument that is not a list, compiled_fn None) run the closure itself, for
 * its exact errors. torch_aot_rt/_params_prepend.py builds it where the closure is
 * made.
 * ====================================================================== */
#include "fn_object.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;     /* the closure */
    PyObject *compiled_fn;  /* its cells */
    PyObject *params;
    bool boxed;
} ParamsPrepend;

static PyObject *
ParamsPrepend_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                         PyObject *kwnames)
{
    ParamsPrepend *self = (ParamsPrepend *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *compiled_fn = PyCell_GET(self->compiled_fn);
    PyObject *params = PyCell_GET(self->params);
    bool plain = (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) &&
                 compiled_fn != NULL && compiled_fn != Py_None && params != NULL &&
                 PyList_CheckExact(params) &&
                 (!self->boxed || (nargs == 1 && PyList_CheckExact(argv[0])));
    if (!plain) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    /* the arguments: the call's, or (boxed) the items of its one list (an
     * empty list's items pointer may be NULL) */
    PyObject *const *runtime = argv;
    Py_ssize_t n_runtime = nargs;
    if (self->boxed) {
        runtime = ((PyListObject *)argv[0])->ob_item;
        n_runtime = PyList_GET_SIZE(argv[0]);
    }
    Py_ssize_t n_params = PyList_GET_SIZE(params);
    PyObject *full = PyList_New(n_params + n_runtime);
    if (full == NULL) {
        return NULL;
    }
    /* the allocation may have run a collection, and finalizers with it */
    if (PyList_GET_SIZE(params) != n_params ||
        (self->boxed && (PyList_GET_SIZE(argv[0]) != n_runtime ||
                         ((PyListObject *)argv[0])->ob_item != runtime))) {
        Py_DECREF(full);
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    for (Py_ssize_t i = 0; i < n_params; i++) {
        PyList_SET_ITEM(full, i, Py_NewRef(PyList_GET_ITEM(params, i)));
    }
    for (Py_ssize_t i = 0; i < n_runtime; i++) {
        PyList_SET_ITEM(full, n_params + i, Py_NewRef(runtime[i]));
    }
    if (self->boxed && PyList_SetSlice(argv[0], 0, n_runtime, NULL) < 0) {
        /* runtime_args.clear() */
        Py_DECREF(full);
        return NULL;
    }
    Py_INCREF(compiled_fn);
    PyObject *result = PyObject_Vectorcall(compiled_fn, &full, 1, NULL);
    Py_DECREF(compiled_fn);
    Py_DECREF(full);
    return result;
}

static PyObject *
ParamsPrepend_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"forward", "compiled_fn_cell", "params_cell", "boxed", NULL};
    PyObject *forward, *compiled_fn, *params;
    int boxed;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!p:ParamsPrepend", keywords,
                                     &forward, &PyCell_Type, &compiled_fn, &PyCell_Type,
                                     &params, &boxed)) {
        return NULL;
    }
    if (!PyCallable_Check(forward)) {
        PyErr_SetString(PyExc_TypeError, "ParamsPrepend: forward must be callable");
        return NULL;
    }
    ParamsPrepend *self = (ParamsPrepend *)rt_fn_alloc(type, ParamsPrepend_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(forward);
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->params = Py_NewRef(params);
    self->boxed = boxed != 0;
    return (PyObject *)self;
}

static int
ParamsPrepend_traverse(ParamsPrepend *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    Py_VISIT(self->params);
    return 0;
}

static int
ParamsPrepend_clear(ParamsPrepend *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    Py_CLEAR(self->params);
    return 0;
}

DEFINE_DEALLOC(ParamsPrepend, (void)0)
FN_MEMBERS(ParamsPrepend)
FN_SPEC(ParamsPrepend,
        "ParamsPrepend(forward, compiled_fn_cell, params_cell, boxed): "
        "aot_module_simplified's forward (compiled_fn(params + args)) in C.")
