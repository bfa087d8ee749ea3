/* forwarding_wrapper.c: ForwardingWrapper, a compiler wrapper's reference
 * closure that only passes the call on (runtime_wrappers.py, torch 2.12).
 *
 * On 2.12 two compiler wrappers return a closure around every compiled
 * function, needed or not (2.13 on return compiled_fn itself):
 *
 *     # FunctionalizedRngRuntimeWrapper.post_compile, RNG not functionalized
 *     def wrapper(runtime_args):
 *         if runtime_metadata.is_rng_op_functionalized: ...
 *         return compiled_fn(runtime_args)
 *
 *     # EffectTokensWrapper.post_compile, no tokens
 *     def inner_fn(args):
 *         if num_tokens > 0: ...
 *         outs = compiled_fn(args)
 *         if outs is None:
 *             return None
 *         return outs[num_tokens:] if num_tokens != 0 else outs
 *
 * Both return compiled_fn(args) as it is. The plain call (one exact list)
 * does that by vectorcall; any other runs the closure itself.
 * torch_aot_rt/_wrappers.py builds one only where the condition is false
 * when it is built (is_rng_op_functionalized, len(tokens)): both are fixed
 * fields of the metadata the closure reads.
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* the closure */
    PyObject *compiled_fn; /* its compiled_fn cell */
} ForwardingWrapper;

static PyObject *
ForwardingWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                             PyObject *kwnames)
{
    ForwardingWrapper *self = (ForwardingWrapper *)op;
    if (!rt_plain_list_call(argv, nargsf, kwnames)) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    return PyObject_Vectorcall(self->compiled_fn, argv, 1, NULL);
}

static PyObject *
ForwardingWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn", NULL};
    PyObject *upstream, *compiled_fn;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:ForwardingWrapper", keywords,
                                     &upstream, &compiled_fn)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || !PyCallable_Check(compiled_fn)) {
        PyErr_SetString(PyExc_TypeError,
                        "ForwardingWrapper: upstream and compiled_fn must be callable");
        return NULL;
    }
    ForwardingWrapper *self =
        (ForwardingWrapper *)rt_fn_alloc(type, ForwardingWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    return (PyObject *)self;
}

static int
ForwardingWrapper_traverse(ForwardingWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    return 0;
}

static int
ForwardingWrapper_clear(ForwardingWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    return 0;
}

DEFINE_DEALLOC(ForwardingWrapper, (void)0)
FN_MEMBERS(ForwardingWrapper)
FN_SPEC(ForwardingWrapper,
        "ForwardingWrapper(upstream, compiled_fn): a torch 2.12 compiler wrapper's closure "
        "that only calls compiled_fn(args) (FunctionalizedRngRuntimeWrapper without RNG "
        "functionalization, EffectTokensWrapper without tokens), in C.")
