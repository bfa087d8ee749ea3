/* compile_wrapper_install.c: making a compile_wrapper function ours (its
 * calls reach CompileWrapper through its vectorcall, or on CPython 3.11
 * through its code), forgetting it, and the CompileWrapper type (see
 * compile_wrapper.c). */
#include "dynamo/compile_wrapper_call.h"

/* ---- making a compile_wrapper function ours ------------------------------- */

int
rt_is_c_compile_wrapper(PyObject *obj)
{
    if (!PyFunction_Check(obj)) {
        return 0;
    }
    if (rt_function_vectorcall(obj) == rt_cw_function_call) {
        return 1;
    }
    /* 3.11: its code is a trampoline, whose constants hold its CompileWrapper */
    rt_state *st = rt_cw_bound_state;
    PyObject *code = PyFunction_GET_CODE(obj);
    if (st == NULL || st->dynamo.cw.trampoline == NULL || code == st->dynamo.cw.code ||
        ((PyCodeObject *)code)->co_filename != ((PyCodeObject *)st->dynamo.cw.trampoline)->co_filename) {
        return 0;
    }
    PyObject *consts = ((PyCodeObject *)code)->co_consts;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) {
        if (Py_IS_TYPE(PyTuple_GET_ITEM(consts, i), st->dynamo.types.CompileWrapperType)) {
            return 1;
        }
    }
    return 0;
}

PyObject *
rt_is_c_compile_wrapper_py(PyObject *Py_UNUSED(module), PyObject *obj)
{
    return PyBool_FromLong(rt_is_c_compile_wrapper(obj));
}

/* CPython 3.11: fn's code becomes the trampoline with self as its
 * constant (the trampoline's placeholder replaced); 0, or -1 with an
 * exception. */
static int
set_trampoline(rt_cw_state *cw, PyObject *fn, CompileWrapper *self)
{
    PyObject *consts = PyObject_GetAttr(cw->trampoline, cw->str_consts);
    PyObject *mine = consts != NULL ? PySequence_List(consts) : NULL;
    Py_XDECREF(consts);
    if (mine == NULL) {
        return -1;
    }
    int placed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(mine); i++) {
        PyObject *item = PyList_GET_ITEM(mine, i);
        if (PyUnicode_Check(item) && PyUnicode_CompareWithASCIIString(item, RT_FRAME_PLACEHOLDER) == 0) {
            PyList_SetItem(mine, i, Py_NewRef((PyObject *)self)); /* steals */
            placed = 1;
        }
    }
    PyObject *tuple = placed ? PyList_AsTuple(mine) : NULL;
    Py_DECREF(mine);
    if (tuple == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "_bind_compile_wrapper: the trampoline has no "
                                              "placeholder constant");
        }
        return -1;
    }
    PyObject *argv[2] = {cw->trampoline, tuple};
    PyObject *kwnames = PyTuple_Pack(1, cw->str_consts);
    PyObject *code = kwnames != NULL ? PyObject_VectorcallMethod(
                                           cw->str_replace, argv,
                                           1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames)
                                     : NULL;
    Py_XDECREF(kwnames);
    Py_DECREF(tuple);
    if (code == NULL) {
        return -1;
    }
    int rc = PyObject_SetAttrString(fn, "__code__", code); /* checks its free variables */
    Py_DECREF(code);
    return rc;
}

PyObject *
rt_compile_wrapper_for(PyObject *module, PyObject *wrapper)
{
    rt_state *st = PyModule_GetState(module);
    rt_cw_state *cw = &st->dynamo.cw;
    if (cw->code == NULL || !PyFunction_Check(wrapper) || PyFunction_GET_CODE(wrapper) != cw->code ||
        rt_is_c_compile_wrapper(wrapper)) {
        return Py_NewRef(wrapper);
    }
    PyObject *closure = PyFunction_GET_CLOSURE(wrapper);
    if (closure == NULL || !PyTuple_Check(closure)) {
        return Py_NewRef(wrapper);
    }
    for (int i = 0; i < 5; i++) {
        if (cw->cell[i] >= PyTuple_GET_SIZE(closure)) {
            return Py_NewRef(wrapper);
        }
    }
    CompileWrapper *self = PyObject_GC_New(CompileWrapper, st->dynamo.types.CompileWrapperType);
    if (self == NULL) {
        return NULL;
    }
    /* 3.11: called by the trampoline; else called only as the weak reference's
     * callback (tp_call) */
    self->vectorcall = cw->trampoline != NULL ? rt_cw_vectorcall : NULL;
    self->module = Py_NewRef(module);
    self->fn = wrapper;
    memset(&self->ctx, 0, sizeof(self->ctx));
    if (rt_cw_plain_call == NULL) {
        rt_cw_plain_call = rt_function_vectorcall(wrapper); /* a fresh function's */
    }
    rt_cw_bound_state = st;
    if (cw->trampoline != NULL) {
        /* 3.11: owned by the function's code; a plain weak reference */
        self->weakref = PyWeakref_NewRef(wrapper, NULL);
        PyObject_GC_Track(self);
        int rc = self->weakref != NULL ? set_trampoline(cw, wrapper, self) : -1;
        Py_DECREF(self);
        if (rc < 0) {
            return NULL;
        }
    }
    else {
        /* owned by fns until the function goes */
        self->weakref = PyWeakref_NewRef(wrapper, (PyObject *)self);
        PyObject_GC_Track(self);
        if (self->weakref == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        if (rt_ptr_map_add(&cw->fns, wrapper, (uint64_t)(uintptr_t)self) == NULL) {
            Py_CLEAR(self->weakref);
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        rt_function_set_vectorcall(wrapper, rt_cw_function_call);
    }
    cw->counts[RT_CW_BUILT]++;
    return Py_NewRef(wrapper);
}

/* Removes self's entry (the function's end, or the module's clear). */
static void
forget(CompileWrapper *self)
{
    PyObject *module = self->module;
    rt_state *st = module != NULL ? PyModule_GetState(module) : NULL;
    rt_ptr_entry *e = st != NULL ? rt_ptr_map_find(&st->dynamo.cw.fns, self->fn) : NULL;
    if (e != NULL && e->value == (uint64_t)(uintptr_t)self) {
        rt_ptr_map_remove(&st->dynamo.cw.fns, e);
        Py_DECREF(self); /* the table's reference */
    }
}

/* The weak reference's callback: the function is going. */
static PyObject *
CompileWrapper_call(PyObject *op, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    CompileWrapper *self = (CompileWrapper *)Py_NewRef(op);
    Py_CLEAR(self->weakref); /* the cycle with its callback */
    forget(self);
    Py_DECREF(self);
    Py_RETURN_NONE;
}

void
rt_cw_forget_all(rt_cw_state *cw)
{
    while (cw->fns.used > 0) {
        for (size_t i = 0; i < cw->fns.capacity; i++) {
            if (cw->fns.slots[i].key != NULL) {
                CompileWrapper *self = (CompileWrapper *)(uintptr_t)cw->fns.slots[i].value;
                rt_ptr_map_remove(&cw->fns, &cw->fns.slots[i]);
                Py_CLEAR(self->weakref);
                Py_DECREF(self);
                break; /* the removal moved entries: start over */
            }
        }
    }
    rt_ptr_map_free(&cw->fns);
    if (rt_cw_bound_state != NULL && &rt_cw_bound_state->dynamo.cw == cw) {
        rt_cw_bound_state = NULL;
    }
}

int
rt_cw_fns_traverse(rt_cw_state *cw, visitproc visit, void *arg)
{
    for (size_t i = 0; i < cw->fns.capacity; i++) {
        if (cw->fns.slots[i].key != NULL) {
            Py_VISIT((PyObject *)(uintptr_t)cw->fns.slots[i].value);
        }
    }
    return 0;
}

static int
CompileWrapper_traverse(CompileWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->weakref);
    return rt_attr_memo_traverse(&self->ctx, visit, arg);
}

static int
CompileWrapper_clear(CompileWrapper *self)
{
    Py_CLEAR(self->weakref);
    rt_attr_memo_clear(&self->ctx);
    return 0;
}

static void
CompileWrapper_dealloc(CompileWrapper *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    CompileWrapper_clear(self);
    Py_CLEAR(self->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef CompileWrapper_methods[] = {
    {"_exit", rt_cw_exit, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef CompileWrapper_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(CompileWrapper, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot CompileWrapper_slots[] = {
    {Py_tp_members, CompileWrapper_members},
    {Py_tp_methods, CompileWrapper_methods},
    {Py_tp_dealloc, CompileWrapper_dealloc},
    {Py_tp_traverse, CompileWrapper_traverse},
    {Py_tp_clear, CompileWrapper_clear},
    {Py_tp_call, CompileWrapper_call},
    {Py_tp_doc, (void *)"What the C side keeps of one compiled function whose calls it runs "
                        "(torch.compile's compile_wrapper, which stays upstream's function "
                        "object); the callback of its weak reference to the function."},
    {0, NULL},
};

PyType_Spec CompileWrapper_spec = {
    .name = "torch_aot_rt._C.CompileWrapper",
    .basicsize = sizeof(CompileWrapper),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = CompileWrapper_slots,
};
