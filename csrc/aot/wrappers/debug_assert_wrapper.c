/* debug_assert_wrapper.c: DebugAssertWrapper, the function
 * DebugAssertWrapper.post_compile returns (runtime_wrappers.py), in C.
 *
 * Under config.debug_assert, a training graph's compiled function is wrapped
 * in a generated function that checks, per call, what was assumed at
 * compile time about each argument i (flat_requires_grad[i]):
 *
 *     def inner_fn(args):
 *         if isinstance(args[i], Tensor): raise AssertionError('expected non-Tensor for arg i, got Tensor')  # None
 *         if args[j].requires_grad: raise AssertionError(_msg)   # False; format_guard_bug_msg(...)
 *         return compiled_fn(args)
 *
 * The C call runs the same checks in the same order, with the same messages
 * (the shim computes them with upstream's helpers), for an exact list long
 * enough for every check; any other call runs the generated function.
 *
 * 2.11's post_compile returns a closure, debug_compiled_function, that does
 * the same per argument, `for i, a in enumerate(args)`, reading
 * self.flat_requires_grad[i] (and formatting the message when one fails):
 * built with n_args = len(flat_requires_grad), the C call takes a list of
 * exactly that length (a longer one raises IndexError there, a shorter one
 * checks fewer: both run the closure).
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* inner_fn */
    PyObject *compiled_fn; /* its compiled_fn */
    PyObject *tensor;      /* its Tensor */
    PyObject *messages;    /* tuple: the AssertionError message of each check */
    Py_ssize_t n;
    Py_ssize_t *index;     /* the argument each check reads */
    bool *is_tensor_check; /* isinstance(.., Tensor) (None) or .requires_grad (False) */
    Py_ssize_t need;
    Py_ssize_t n_args;     /* 2.11's closure: the one length taken; -1: any >= need */
} DebugAssertWrapper;

static PyObject *
DebugAssertWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                              PyObject *kwnames)
{
    DebugAssertWrapper *self = (DebugAssertWrapper *)op;
    if (!rt_plain_list_call(argv, nargsf, kwnames) || PyList_GET_SIZE(argv[0]) < self->need ||
        (self->n_args >= 0 && PyList_GET_SIZE(argv[0]) != self->n_args)) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    for (Py_ssize_t c = 0; c < self->n; c++) {
        PyObject *a = rt_list_item(argv[0], self->index[c]);
        if (a == NULL) {
            return NULL;
        }
        int hit;
        Py_INCREF(a);
        if (self->is_tensor_check[c]) {
            hit = PyObject_IsInstance(a, self->tensor);
        }
        else {
            PyObject *rg = PyObject_GetAttr(a, self->st->torch.obj.str_requires_grad);
            hit = rg == NULL ? -1 : PyObject_IsTrue(rg);
            Py_XDECREF(rg);
        }
        Py_DECREF(a);
        if (hit < 0) {
            return NULL;
        }
        if (hit) {
            PyErr_SetObject(PyExc_AssertionError, PyTuple_GET_ITEM(self->messages, c));
            return NULL;
        }
    }
    return PyObject_Vectorcall(self->compiled_fn, argv, 1, NULL);
}

static PyObject *
DebugAssertWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn", "tensor", "checks", "n_args", NULL};
    PyObject *upstream, *compiled_fn, *tensor, *checks;
    Py_ssize_t n_args = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO!|$n:DebugAssertWrapper", keywords,
                                     &upstream, &compiled_fn, &tensor, &PyTuple_Type,
                                     &checks, &n_args)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || !PyCallable_Check(compiled_fn)) {
        PyErr_SetString(PyExc_TypeError,
                        "DebugAssertWrapper: upstream and compiled_fn must be callable");
        return NULL;
    }
    DebugAssertWrapper *self =
        (DebugAssertWrapper *)rt_fn_alloc(type, DebugAssertWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->tensor = Py_NewRef(tensor);
    self->n_args = n_args < 0 ? -1 : n_args;
    self->n = PyTuple_GET_SIZE(checks);
    self->index = PyMem_Malloc(((size_t)self->n + 1) * sizeof(Py_ssize_t));
    self->is_tensor_check = PyMem_Malloc((size_t)self->n + 1);
    if ((self->messages = PyTuple_New(self->n)) == NULL) {
        goto error;
    }
    if (self->index == NULL || self->is_tensor_check == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t c = 0; c < self->n; c++) {
        /* (index, is_tensor_check, message) */
        PyObject *check = PyTuple_GET_ITEM(checks, c);
        Py_ssize_t i;
        int is_tensor;
        PyObject *msg;
        if (!PyTuple_Check(check) ||
            !PyArg_ParseTuple(check, "npU:DebugAssertWrapper check", &i, &is_tensor, &msg) ||
            i < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "DebugAssertWrapper: checks must be (index, is_tensor_check, "
                                "message) tuples with a non-negative index");
            }
            goto error;
        }
        self->index[c] = i;
        self->is_tensor_check[c] = is_tensor != 0;
        PyTuple_SET_ITEM(self->messages, c, Py_NewRef(msg));
        if (i + 1 > self->need) {
            self->need = i + 1;
        }
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static int
DebugAssertWrapper_traverse(DebugAssertWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    Py_VISIT(self->tensor);
    return 0;
}

static int
DebugAssertWrapper_clear(DebugAssertWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->messages);
    return 0;
}

DEFINE_DEALLOC(DebugAssertWrapper, {
    PyMem_Free(self->index);
    PyMem_Free(self->is_tensor_check);
})
FN_MEMBERS(DebugAssertWrapper)
FN_SPEC(DebugAssertWrapper,
        "DebugAssertWrapper(upstream, compiled_fn, tensor, checks, *, n_args=-1): "
        "DebugAssertWrapper.post_compile's inner_fn (per-argument debug assertions) in C; "
        "n_args: 2.11's closure, the one argument count taken.")
