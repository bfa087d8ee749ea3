/* function_apply.c: FunctionApply, the boxed `CompiledFunction.apply` the
 * runtime wrapper calls (upstream: make_boxed_func(CompiledFunction.apply),
 * i.e. Function.apply in torch/autograd/function.py). */
#include "fn_object.h"

/* ======================================================================
 * FunctionApply: `CompiledFunction.apply`, boxed.
 *
 * Where Function.apply is a Python classmethod (2.13), it does, for a class
 * without setup_context: if no functorch transform is active, unwrap dead
 * functorch wrappers among the tensor args and call _FunctionBase.apply;
 * else go through custom_function_call. We do the first directly, with the
 * same unwrap_if_dead per tensor, and hand the second to upstream's Python.
 * Where Function.apply is _FunctionBase.apply itself (2.14: that logic is in
 * C++), we call it, which is exactly what upstream calls.
 *
 * With the C++ part, a plan built with `node=True` first
 * offers the call to the C++ autograd node (torch_cpp_api.h node_apply),
 * which does _FunctionBase.apply's work with a C++ node as the ctx; what it
 * declines, and every call while a functorch transform is active, goes the
 * way above. Each call's decision is counted.
 * ====================================================================== */

typedef struct {
    RT_FN_HEAD
    PyObject *apply_base;    /* _FunctionBase.apply bound to the class */
    PyObject *apply_python;  /* CompiledFunction.apply: Function.apply */
    bool apply_is_base;      /* the two are the same function */
    PyObject *node_cls;      /* the class, for the C++ node; NULL: never offered */
} FunctionApply;

/* The C++ node's Function.apply: a new reference, NULL with an exception,
 * or NULL without one when this call is for upstream's Function.apply.
 * `functorch_active` is _are_functorch_transforms_active(), already asked.
 * Compiled autograd, on or off, takes the node as it takes PyNode
 * (compiled_node_compiled_autograd.cpp). */
static PyObject *
node_apply(FunctionApply *self, PyObject *args, int functorch_active)
{
    rt_state *st = self->st;
    int reason = RT_NODE_FUNCTORCH;
    PyObject *result = NULL;
    if (!functorch_active) {
        result = st->torch.cpp->node_apply(self->node_cls, args, &reason);
        if (result == NULL && reason == RT_NODE_TAKEN) {
            return NULL; /* raised */
        }
    }
    st->aot.node_counts[reason]++;
    return result;
}

/* 2.13's Function.apply with no functorch transform active: unwrap dead
 * functorch wrappers among the tensor args, then _FunctionBase.apply. */
static PyObject *
apply_unwrapped(FunctionApply *self, PyObject *args)
{
    rt_state *st = self->st;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *stack_args[RT_STACK_ARGS];
    PyObject **stack = n <= RT_STACK_ARGS ? stack_args : PyMem_Malloc(n * sizeof(PyObject *));
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t filled = 0;
    for (; filled < n; filled++) {
        PyObject *arg = PyTuple_GET_ITEM(args, filled);
        int is_tensor = rt_is_tensor(st, arg);
        if (is_tensor < 0) {
            break;
        }
        stack[filled] = is_tensor ? PyObject_Vectorcall(st->aot.obj.unwrap_if_dead, &arg, 1, NULL)
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
    return result;
}

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
    int active = -2; /* not asked yet */
    if (self->node_cls != NULL && st->torch.cpp != NULL) {
        active = rt_functorch_transforms_active(st);
        if (active < 0) {
            goto done;
        }
        result = node_apply(self, args, active);
        if (result != NULL || PyErr_Occurred()) {
            goto done;
        }
    }
    if (self->apply_is_base) {
        result = PyObject_Call(self->apply_base, args, NULL);
        goto done;
    }
    if (active == -2 && (active = rt_functorch_transforms_active(st)) < 0) {
        goto done;
    }
    result = active ? PyObject_Call(self->apply_python, args, NULL)
                    : apply_unwrapped(self, args);
done:
    Py_DECREF(args);
    return result;
}

static PyObject *
FunctionApply_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"", "apply_is_base", "node", NULL};
    PyObject *cls;
    int apply_is_base = 0, node = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$pp:FunctionApply", keywords, &cls,
                                     &apply_is_base, &node)) {
        return NULL;
    }
    FunctionApply *self = (FunctionApply *)rt_fn_alloc(type, FunctionApply_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    rt_state *st = self->st;
    int sub = PyType_Check(cls) ? PyObject_IsSubclass(cls, st->aot.obj.FunctionBase) : 0;
    if (sub <= 0) {
        if (sub == 0) {
            PyErr_SetString(PyExc_ValueError, "plan: FunctionApply needs an autograd.Function class");
        }
        Py_DECREF(self);
        return NULL;
    }
    descrgetfunc get = Py_TYPE(st->aot.obj.function_base_apply)->tp_descr_get;
    self->apply_base = get ? get(st->aot.obj.function_base_apply, NULL, cls) : NULL;
    self->apply_python = PyObject_GetAttrString(cls, "apply");
    if (self->apply_base == NULL || self->apply_python == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_FunctionBase.apply is not a descriptor");
        }
        Py_DECREF(self);
        return NULL;
    }
    self->apply_is_base = apply_is_base;
    self->node_cls = node ? Py_NewRef(cls) : NULL;
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
    Py_VISIT(self->node_cls);
    return 0;
}

static int
FunctionApply_clear(FunctionApply *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->apply_base);
    Py_CLEAR(self->apply_python);
    Py_CLEAR(self->node_cls);
    return 0;
}

DEFINE_DEALLOC(FunctionApply, (void)0)
FN_MEMBERS(FunctionApply)
FN_SPEC(FunctionApply,
        "FunctionApply(cls, *, apply_is_base, node=False): CompiledFunction.apply, boxed (called with "
        "the args list).")
