/* bytecode_helper.c: BytecodeHelper, the functions of torch._dynamo.utils
 * that Dynamo's transformed bytecode calls on every call of a compiled
 * frame, in C. Each is decorated with torch._disable_dynamo and loaded as
 * an attribute of the module at each call (codegen.py's load_import_from):
 *
 * - with torch._dynamo.config.record_runtime_overhead (the default), around
 *   the code that prepares a graph's arguments:
 *
 *       cm = torch._dynamo.utils.record_pregraph_bytecode_enter()
 *       ... the graph's arguments ...
 *       torch._dynamo.utils.record_pregraph_bytecode_exit(cm)
 *
 * - for a dynamic size, stride or storage offset the graph takes
 *   (TensorPropertySource.reconstruct, source.py):
 *
 *       torch._dynamo.utils.call_size(x, i)          # x.size(i)
 *       torch._dynamo.utils.call_stride(x, i)        # x.stride(i)
 *       torch._dynamo.utils.call_storage_offset(x)   # x.storage_offset()
 *
 * Each call runs _disable_dynamo's `inner` (torch/_compile.py):
 *
 *     disable_fn = getattr(fn, "__dynamo_disable", None)
 *     if disable_fn is None:          # the first call only
 *         disable_fn = torch._dynamo.disable(fn, recursive, wrapping=False)
 *         fn.__dynamo_disable = disable_fn
 *     return disable_fn(*args, **kwargs)
 *
 * then DisableContext's `_fn` around it (dynamo/disable.c), then the body
 * (torch/_dynamo/utils.py):
 *
 *     enter: cm = (torch._C._profiler._RecordFunctionFast("Pregraph bytecode")
 *                  if torch.autograd.profiler._is_profiler_enabled
 *                  else contextlib.nullcontext())
 *            cm.__enter__(); return cm
 *     exit:  cm.__exit__(None, None, None)
 *     call_size and the others: the method call, through the object
 *            protocol as the bytecode makes it (a subclass's size() too)
 *
 * A BytecodeHelper replaces the module attribute. Per call it makes the same
 * checks in the same order and, in the state the C path handles (the C
 * runtime switched on, `fn.__dynamo_disable` the wrapper found at install,
 * the arguments the body takes, and rt_disable_fast_path's state: the
 * default stance, not exporting), the same eval-frame calls around a C
 * body; anything else calls upstream's `inner` (or, past `inner`'s look-up,
 * its `_fn`), counted. Where the C version differs on purpose: with the
 * profiler off, the context manager the enter returns (and the exit gets
 * back) is a shared _C.NullContext, whose __enter__ and __exit__ do what
 * nullcontext's do (nothing, None), not a new contextlib.nullcontext:
 * nothing but the frame's bytecode ever holds it.
 * ====================================================================== */
#include "dynamo/dynamo.h"
#include "fn_object.h"

/* the functions replaced: their names in torch._dynamo.utils, bodies below */
enum helper_kind {
    HELPER_PREGRAPH_ENTER,
    HELPER_PREGRAPH_EXIT,
    HELPER_SIZE,
    HELPER_STRIDE,
    HELPER_STORAGE_OFFSET,
    HELPER_N
};

typedef struct {
    RT_FN_HEAD
    int kind;             /* enum helper_kind */
    PyObject *method;     /* size, stride, storage_offset: its name, interned */
    PyObject *upstream;   /* the module attribute replaced: inner */
    PyObject *fn;         /* inner's fn, whose __dict__ holds __dynamo_disable */
    PyObject *wrapper;    /* the __dynamo_disable found there: DisableContext's _fn */
    PyObject *fn_cell;    /* its `fn` and `self` cells */
    PyObject *ctx_cell;
    PyObject *switch_;    /* torch_aot_rt._state._enabled, [bool] */
} BytecodeHelper;

/* _C.NullContext: contextlib.nullcontext() as the enter's body uses it */
typedef struct {
    PyObject_HEAD
} NullContext;

static PyObject *
NullContext_enter(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_NONE;
}

static PyObject *
NullContext_exit(PyObject *Py_UNUSED(self), PyObject *const *Py_UNUSED(args),
                 Py_ssize_t Py_UNUSED(nargs))
{
    Py_RETURN_NONE;
}

static PyMethodDef NullContext_methods[] = {
    {"__enter__", NullContext_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))NullContext_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot NullContext_slots[] = {
    {Py_tp_methods, NullContext_methods},
    {Py_tp_doc, (void *)"What contextlib.nullcontext() does as a context manager; "
                        "BytecodeHelper's enter returns the one instance."},
    {0, NULL},
};

PyType_Spec NullContext_spec = {
    .name = "torch_aot_rt._C.NullContext",
    .basicsize = sizeof(NullContext),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = NullContext_slots,
};

/* ---- the bodies --------------------------------------------------------- */

/* record_pregraph_bytecode_enter's body */
static PyObject *
enter_body(PyObject *op, PyObject *const *Py_UNUSED(argv), size_t Py_UNUSED(nargsf),
           PyObject *Py_UNUSED(kwnames))
{
    rt_state *st = ((BytecodeHelper *)op)->st;
    PyObject *on = PyDict_GetItemWithError(st->torch.obj.profiler_globals, st->torch.obj.str_is_profiler_enabled);
    if (on == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AttributeError,
                            "module 'torch.autograd.profiler' has no attribute "
                            "'_is_profiler_enabled'");
        }
        return NULL;
    }
    int v = PyObject_IsTrue(on);
    if (v < 0) {
        return NULL;
    }
    PyObject *cm = v ? PyObject_CallOneArg(st->torch.obj.RecordFunctionFast, st->dynamo.obj.str_pregraph_range)
                     : Py_NewRef(st->dynamo.obj.null_context);
    if (cm != NULL && rt_context_enter(st, cm) < 0) {
        Py_CLEAR(cm);
    }
    return cm;
}

/* record_pregraph_bytecode_exit's body: cm.__exit__(None, None, None) */
static PyObject *
exit_body(PyObject *op, PyObject *const *argv, size_t Py_UNUSED(nargsf),
          PyObject *Py_UNUSED(kwnames))
{
    if (rt_context_exit(((BytecodeHelper *)op)->st, argv[0], 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* call_size(x, i), call_stride(x, i), call_storage_offset(x): x.method(...) */
static PyObject *
method_body(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *Py_UNUSED(kwnames))
{
    return PyObject_VectorcallMethod(((BytecodeHelper *)op)->method, argv,
                                     PyVectorcall_NARGS(nargsf), NULL);
}

static const struct {
    const char *name;     /* the attribute of torch._dynamo.utils */
    const char *method;   /* the tensor method the body calls, or NULL */
    Py_ssize_t nargs;     /* the positional arguments the body takes */
    vectorcallfunc body;
} helper_kinds[HELPER_N] = {
    [HELPER_PREGRAPH_ENTER] = {"record_pregraph_bytecode_enter", NULL, 0, enter_body},
    [HELPER_PREGRAPH_EXIT] = {"record_pregraph_bytecode_exit", NULL, 1, exit_body},
    [HELPER_SIZE] = {"call_size", "size", 2, method_body},
    [HELPER_STRIDE] = {"call_stride", "stride", 2, method_body},
    [HELPER_STORAGE_OFFSET] = {"call_storage_offset", "storage_offset", 1, method_body},
};

/* ---- the call ----------------------------------------------------------- */

static PyObject *
BytecodeHelper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    BytecodeHelper *self = (BytecodeHelper *)op;
    rt_state *st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* the C runtime off, or arguments the body does not take (its error
     * is upstream's, raised inside _fn): upstream's inner */
    if (PyList_GET_ITEM(self->switch_, 0) != Py_True || kwnames != NULL ||
        nargs != helper_kinds[self->kind].nargs) {
        st->dynamo.helper_counts[RT_HELPER_UPSTREAM]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    /* inner: getattr(fn, "__dynamo_disable", None) */
    PyObject *wrapper = PyObject_GetAttr(self->fn, st->dynamo.obj.str_dynamo_disable);
    if (wrapper == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return NULL;
        }
        PyErr_Clear();
    }
    Py_XDECREF(wrapper); /* compared by identity only; fn keeps it */
    if (wrapper != self->wrapper) {
        st->dynamo.helper_counts[RT_HELPER_UPSTREAM]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    /* _fn */
    rt_disable_state *ds = &st->dynamo.disable;
    PyObject *fn = PyCell_GET(self->fn_cell);
    int path = fn != self->fn ? RT_DISABLE_CALL_REPLACED
                              : rt_disable_fast_path(ds, self->ctx_cell, fn);
    if (path < 0) {
        return NULL;
    }
    if (path != RT_DISABLE_CALL_C) {
        st->dynamo.helper_counts[RT_HELPER_WRAPPER]++;
        return PyObject_Vectorcall(self->wrapper, argv, nargsf, kwnames);
    }
    st->dynamo.helper_counts[RT_HELPER_C]++;
    return rt_disable_run(ds, helper_kinds[self->kind].body, op, argv, nargsf, kwnames);
}

/* ---- construction ------------------------------------------------------- */

static PyObject *
BytecodeHelper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "fn", "wrapper", "switch", "name", NULL};
    PyObject *upstream, *fn, *wrapper, *switch_;
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO!$s:BytecodeHelper", keywords, &upstream,
                                     &fn, &wrapper, &PyList_Type, &switch_, &name)) {
        return NULL;
    }
    int kind = 0;
    while (kind < HELPER_N && strcmp(helper_kinds[kind].name, name) != 0) {
        kind++;
    }
    if (kind == HELPER_N) {
        PyErr_Format(PyExc_ValueError, "BytecodeHelper: no C body for %s", name);
        return NULL;
    }
    if (PyList_GET_SIZE(switch_) != 1 || !PyCallable_Check(upstream)) {
        PyErr_SetString(PyExc_ValueError,
                        "BytecodeHelper: upstream must be callable, switch a one-item list");
        return NULL;
    }
    BytecodeHelper *self = (BytecodeHelper *)rt_fn_alloc(type, BytecodeHelper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    rt_disable_state *ds = &self->st->dynamo.disable;
    PyObject *closure = NULL;
    if (ds->fn_code != NULL && PyFunction_Check(wrapper) &&
        PyFunction_GET_CODE(wrapper) == ds->fn_code) {
        closure = PyFunction_GET_CLOSURE(wrapper);
    }
    if (closure == NULL || !PyTuple_Check(closure) ||
        PyTuple_GET_SIZE(closure) <= Py_MAX(ds->fn_cell, ds->ctx_cell) ||
        PyCell_GET(PyTuple_GET_ITEM(closure, ds->fn_cell)) != fn) {
        PyErr_SetString(PyExc_TypeError,
                        "BytecodeHelper: wrapper must be the torch._dynamo.disable wrapper "
                        "of fn (and _bind_disable() called)");
        Py_DECREF(self);
        return NULL;
    }
    self->kind = kind;
    if (helper_kinds[kind].method != NULL &&
        (self->method = PyUnicode_InternFromString(helper_kinds[kind].method)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->fn = Py_NewRef(fn);
    self->wrapper = Py_NewRef(wrapper);
    self->fn_cell = Py_NewRef(PyTuple_GET_ITEM(closure, ds->fn_cell));
    self->ctx_cell = Py_NewRef(PyTuple_GET_ITEM(closure, ds->ctx_cell));
    self->switch_ = Py_NewRef(switch_);
    return (PyObject *)self;
}

static int
BytecodeHelper_traverse(BytecodeHelper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->fn);
    Py_VISIT(self->wrapper);
    Py_VISIT(self->fn_cell);
    Py_VISIT(self->ctx_cell);
    Py_VISIT(self->switch_);
    return 0;
}

static int
BytecodeHelper_clear(BytecodeHelper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->wrapper);
    Py_CLEAR(self->fn_cell);
    Py_CLEAR(self->ctx_cell);
    Py_CLEAR(self->switch_);
    Py_CLEAR(self->method);
    return 0;
}

DEFINE_DEALLOC(BytecodeHelper, (void)0)
FN_MEMBERS(BytecodeHelper)
FN_SPEC(BytecodeHelper,
        "BytecodeHelper(upstream, fn, wrapper, switch, *, name): what "
        "torch._dynamo.utils.<name> (record_pregraph_bytecode_enter or _exit, call_size, "
        "call_stride, call_storage_offset), `upstream`, does when called: in C where the "
        "C runtime is on and the disable wrapper's state allows it; upstream's otherwise.")

/* ---- counts ------------------------------------------------------------- */

static const char *const count_names[RT_HELPER_N] = {
    [RT_HELPER_C] = "calls in C",
    [RT_HELPER_WRAPPER] = "upstream calls: the disable wrapper's state",
    [RT_HELPER_UPSTREAM] = "upstream calls: switched off, another wrapper or other arguments",
};

PyObject *
rt_helper_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_state *st = PyModule_GetState(module);
    return rt_counts_dict("_helper_stats", args, nargs, count_names, st->dynamo.helper_counts,
                          RT_HELPER_N);
}
