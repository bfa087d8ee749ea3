/* optimized_module.c: ModuleCall, OptimizedModule.__call__ in C.
 *
 * Calling a module compiled with torch.compile(module) runs, per call
 * (torch/_dynamo/eval_frame.py):
 *
 *     def __call__(self, *args, **kwargs):
 *         if torch.nn.modules.module._has_any_global_hook():
 *             warnings.warn(...)
 *         with _set_in_optimized_module():       # a @contextmanager:
 *             return super().__call__(*args, **kwargs)
 *
 *     _set_in_optimized_module: old = _in_optimized_module;
 *         _in_optimized_module = True; try: yield; finally: _in_optimized_module = old
 *
 * then nn.Module.__call__, whose forward is the module's compile_wrapper.
 * A ModuleCall replaces the class's __call__ (a method object: called with
 * the module first). For a module whose forward is a compile_wrapper whose calls C runs (made
 * with the C runtime on), with no global module hook (whose warning is
 * upstream's) and eval_frame's context manager and module.py's hook check
 * the ones bound, it sets and restores the module global in C around
 * nn.Module.__call__ (looked up on the class per call, as super() does);
 * any other call is upstream's __call__, counted with the compile wrapper's
 * calls in stats()["dynamo_compile_wrapper"].
 * ====================================================================== */
#include "dynamo/dynamo.h"
#include "fn_object.h"
#include "util/frame_stub.h"

/* module.py's six global hook dicts, in _has_any_global_hook's order */
#define N_HOOK_DICTS 6
static const char *const hook_dict_names[N_HOOK_DICTS] = {
    "_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
    "_global_forward_hooks", "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
};

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;        /* OptimizedModule.__call__, upstream's */
    PyObject *module_cls;      /* torch.nn.Module (super()'s __call__) */
    PyObject *eval_globals;    /* torch._dynamo.eval_frame.__dict__ */
    PyObject *nn_globals;      /* torch.nn.modules.module.__dict__ */
    PyObject *set_in_module;   /* eval_frame._set_in_optimized_module, as bound */
    PyObject *has_any_hook;    /* module._has_any_global_hook, as bound */
    PyObject *hook_names[N_HOOK_DICTS];
    PyObject *frame;           /* the frame stub at super().__call__, or NULL */
    PyObject *str_set_in_module, *str_in_module, *str_has_any_hook, *str_forward, *str_call;
} ModuleCall;

/* 1: the call runs in C; 0: upstream's; -1 with an exception. Reads only. */
static int
takes_c(ModuleCall *self, PyObject *module)
{
    /* the module's forward (in its __dict__: OptimizedModule.__init__ sets
     * it) is a compile_wrapper whose calls C runs, made with the C runtime on */
    PyObject *dict = PyObject_GenericGetDict(module, NULL);
    if (dict == NULL) {
        return -1;
    }
    PyObject *forward = PyDict_GetItemWithError(dict, self->str_forward);
    int is_c = forward != NULL && rt_is_c_compile_wrapper(forward);
    Py_DECREF(dict); /* the module keeps it */
    if (!is_c) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *v = PyDict_GetItemWithError(self->eval_globals, self->str_set_in_module);
    if (v != self->set_in_module) {
        return v == NULL && PyErr_Occurred() ? -1 : 0;
    }
    v = PyDict_GetItemWithError(self->nn_globals, self->str_has_any_hook);
    if (v != self->has_any_hook) {
        return v == NULL && PyErr_Occurred() ? -1 : 0;
    }
    /* _has_any_global_hook(): any of the dicts non-empty (upstream warns) */
    for (int i = 0; i < N_HOOK_DICTS; i++) {
        PyObject *d = PyDict_GetItemWithError(self->nn_globals, self->hook_names[i]);
        if (d == NULL) {
            return PyErr_Occurred() ? -1 : 0;
        }
        int truthy = PyObject_IsTrue(d);
        if (truthy != 0) {
            return truthy < 0 ? -1 : 0;
        }
    }
    return 1;
}

static PyObject *
ModuleCall_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    ModuleCall *self = (ModuleCall *)op;
    rt_cw_state *cw = &self->st->dynamo.cw;
    int c = PyVectorcall_NARGS(nargsf) >= 1 ? takes_c(self, argv[0]) : 0;
    if (c <= 0) {
        if (c < 0) {
            return NULL;
        }
        cw->counts[RT_CW_MODULE_UPSTREAM]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    cw->counts[RT_CW_MODULE_C]++;
    /* with _set_in_optimized_module(): */
    PyObject *old = PyDict_GetItemWithError(self->eval_globals, self->str_in_module);
    if (old == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_in_optimized_module' is not defined");
        }
        return NULL;
    }
    Py_INCREF(old);
    if (PyDict_SetItem(self->eval_globals, self->str_in_module, Py_True) < 0) {
        Py_DECREF(old);
        return NULL;
    }
    /* return super().__call__(*args, **kwargs) */
    PyObject *call = PyObject_GetAttr(self->module_cls, self->str_call);
    PyObject *result = call ? PyObject_Vectorcall(call, argv, nargsf, kwnames) : NULL;
    Py_XDECREF(call);
    /* finally: _in_optimized_module = old */
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = PyDict_SetItem(self->eval_globals, self->str_in_module, old) == 0;
    Py_DECREF(old);
    if (rt_finally_end(&saved, ok) < 0) {
        Py_CLEAR(result);
    }
    if (result == NULL) {
        rt_frame_call call = {argv, nargsf, kwnames,
                              PyFunction_Check(self->upstream) ? PyFunction_GET_CLOSURE(self->upstream)
                                                               : NULL};
        rt_frame_add(self->frame, &call);
    }
    return result;
}

static PyObject *
ModuleCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "module_cls", "eval_frame", "nn_module", "frame",
                               NULL};
    PyObject *upstream, *module_cls, *eval_frame, *nn_module, *frame;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OO!O!O!O:ModuleCall", keywords, &upstream,
                                     &PyType_Type, &module_cls, &PyModule_Type, &eval_frame,
                                     &PyModule_Type, &nn_module, &frame)) {
        return NULL;
    }
    ModuleCall *self = (ModuleCall *)rt_fn_alloc(type, ModuleCall_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->frame = frame != Py_None ? Py_NewRef(frame) : NULL;
    self->module_cls = Py_NewRef(module_cls);
    self->eval_globals = Py_NewRef(PyModule_GetDict(eval_frame));
    self->nn_globals = Py_NewRef(PyModule_GetDict(nn_module));
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&self->str_set_in_module, "_set_in_optimized_module"},
        {&self->str_in_module, "_in_optimized_module"},
        {&self->str_has_any_hook, "_has_any_global_hook"},
        {&self->str_forward, "forward"},
        {&self->str_call, "__call__"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    for (int i = 0; i < N_HOOK_DICTS; i++) {
        if ((self->hook_names[i] = PyUnicode_InternFromString(hook_dict_names[i])) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    self->set_in_module = Py_XNewRef(PyDict_GetItemWithError(self->eval_globals, self->str_set_in_module));
    self->has_any_hook = Py_XNewRef(PyDict_GetItemWithError(self->nn_globals, self->str_has_any_hook));
    if (self->set_in_module == NULL || self->has_any_hook == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "ModuleCall: eval_frame or module.py lacks a name");
        }
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
ModuleCall_traverse(ModuleCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->frame);
    Py_VISIT(self->module_cls);
    Py_VISIT(self->eval_globals);
    Py_VISIT(self->nn_globals);
    Py_VISIT(self->set_in_module);
    Py_VISIT(self->has_any_hook);
    return 0;
}

static int
ModuleCall_clear(ModuleCall *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->frame);
    Py_CLEAR(self->module_cls);
    Py_CLEAR(self->eval_globals);
    Py_CLEAR(self->nn_globals);
    Py_CLEAR(self->set_in_module);
    Py_CLEAR(self->has_any_hook);
    for (int i = 0; i < N_HOOK_DICTS; i++) {
        Py_CLEAR(self->hook_names[i]);
    }
    Py_CLEAR(self->str_set_in_module);
    Py_CLEAR(self->str_in_module);
    Py_CLEAR(self->str_has_any_hook);
    Py_CLEAR(self->str_forward);
    Py_CLEAR(self->str_call);
    return 0;
}

DEFINE_DEALLOC(ModuleCall, (void)0)
FN_MEMBERS(ModuleCall)
FN_SPEC(ModuleCall,
        "ModuleCall(*, upstream, module_cls, eval_frame, nn_module, frame): what "
        "OptimizedModule.__call__, `upstream`, does, in C for a module whose forward is "
        "a compile_wrapper whose calls C runs and no global module hook is registered; upstream's otherwise.")
