/* apply_boxed.c: ApplyBoxed, the backward node's apply_boxed(ctx, grads)
 * (BackwardCFunction.apply_boxed) over the C CompiledBackward. */
#include "aot/autograd/compiled_backward.h"

/* ======================================================================
 * ApplyBoxed: the backward class's apply_boxed(ctx, grads).
 *
 * The engine calls ctx.apply_boxed(grads) for a boxed_grads_call Function;
 * upstream's (BackwardCFunction.apply_boxed) is `self._get_user_fn()(self,
 * *args)`: the class's backward, unless vjp is overridden too (an error).
 * While the class's backward is still ours and vjp Function's, that is our
 * backward; otherwise upstream's apply_boxed runs, exactly.
 * ====================================================================== */

typedef struct {
    RT_FN_HEAD
    PyObject *backward;       /* the CompiledBackward installed on cls */
    PyObject *cls;            /* CompiledFunction */
    PyObject *default_vjp;    /* Function.vjp */
    PyObject *upstream;       /* BackwardCFunction.apply_boxed */
} ApplyBoxed;

static PyObject *
ApplyBoxed_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                      PyObject *kwnames)
{
    ApplyBoxed *self = (ApplyBoxed *)op;
    rt_state *st = self->st;
    PyObject *backward = PyObject_GetAttr(self->cls, st->aot.obj.str_backward);
    if (backward == NULL) {
        return NULL;
    }
    PyObject *vjp = PyObject_GetAttr(self->cls, st->aot.obj.str_vjp);
    if (vjp == NULL) {
        Py_DECREF(backward);
        return NULL;
    }
    int ours = backward == self->backward && vjp == self->default_vjp;
    Py_DECREF(backward);
    Py_DECREF(vjp);
    return PyObject_Vectorcall(ours ? self->backward : self->upstream, argv, nargsf, kwnames);
}

static PyObject *
ApplyBoxed_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *backward, *cls, *default_vjp, *upstream;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "ApplyBoxed() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOO:ApplyBoxed", &backward, &cls, &default_vjp, &upstream)) {
        return NULL;
    }
    ApplyBoxed *self = (ApplyBoxed *)rt_fn_alloc(type, ApplyBoxed_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    if (!Py_IS_TYPE(backward, self->st->aot.types.CompiledBackwardType) || !PyCallable_Check(upstream)) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: ApplyBoxed(CompiledBackward, cls, Function.vjp, apply_boxed)");
        Py_DECREF(self);
        return NULL;
    }
    self->backward = Py_NewRef(backward);
    self->cls = Py_NewRef(cls);
    self->default_vjp = Py_NewRef(default_vjp);
    self->upstream = Py_NewRef(upstream);
    return (PyObject *)self;
}

static int
ApplyBoxed_traverse(ApplyBoxed *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->backward);
    Py_VISIT(self->cls);
    Py_VISIT(self->default_vjp);
    Py_VISIT(self->upstream);
    return 0;
}

static int
ApplyBoxed_clear(ApplyBoxed *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->backward);
    Py_CLEAR(self->cls);
    Py_CLEAR(self->default_vjp);
    Py_CLEAR(self->upstream);
    return 0;
}

DEFINE_DEALLOC(ApplyBoxed, (void)0)
FN_MEMBERS(ApplyBoxed)
FN_SPEC(ApplyBoxed, "ApplyBoxed(backward, cls, Function.vjp, BackwardCFunction.apply_boxed): "
                    "the backward node's apply_boxed in C.")
