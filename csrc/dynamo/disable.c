/* dynamo/disable.c: DisabledCall, torch._dynamo.disable's wrapper in C, for
 * the compiled backward.
 *
 * AOTAutograd's Dynamo backend wraps every compiled backward in
 * torch._dynamo.disable (_wrapped_bw_compiler in torch/_dynamo/backends/
 * common.py; on an AOTAutogradCache hit, GenericCompiledBackward.post_compile),
 * so each backward call runs DisableContext.__call__'s _fn
 * (torch/_dynamo/eval_frame.py):
 *
 *     prior = set_eval_frame(None)
 *     try:
 *         _maybe_set_eval_frame(_callback_from_stance(self.callback))
 *         try:
 *             fn_name = getattr(fn, "__name__", type(fn).__name__)    # 2.13
 *             if torch.compiler.is_exporting() and fn_name != "__torch_dispatch__":
 *                 with fx_traceback.annotate({...}): return fn(*args, **kwargs)
 *             return fn(*args, **kwargs)
 *         finally:
 *             set_eval_frame(None)
 *     finally:
 *         _maybe_set_eval_frame(prior)
 *
 * 2.14 installs the stance's callback (and sets None again on exit) only when
 * it is not None, restores `prior` only when it is not None, and looks up
 * fn's name only when exporting (rt_disable_state.skips_none_callback).
 *
 * DisabledCall(_fn) does the same calls of set_eval_frame, in the same order,
 * in the one state that is the steady state of training: the "default"
 * stance, a DisableContext whose callback is None, not exporting, and
 * eval_frame's helpers the ones bound. Anything else is decided per call,
 * before any side effect, and runs upstream's _fn itself, counted. The C
 * CompiledBackward calls a DisabledCall in place of the compiled backward's
 * wrapper (rt_disable_wrapper_for); CompiledFunction.compiled_bw stays
 * upstream's object.
 * ====================================================================== */
#include "dynamo/disable.h"
#include "util/dict_version.h"
#include "dynamo/dynamo.h"

#include "fn_object.h"
#include "util/intern_names.h"


typedef struct {
    RT_FN_HEAD
    PyObject *upstream; /* the _fn */
    PyObject *fn_cell;  /* its closure's `fn` and `self` cells, read per call */
    PyObject *ctx_cell;
} DisabledCall;

/* ---- per-call state checks --------------------------------------------- */

/* globals[name] is expected (absent when expected is NULL) */
static int
global_is(PyObject *globals, PyObject *name, PyObject *expected)
{
    PyObject *v = PyDict_GetItemWithError(globals, name);
    if (v == NULL && PyErr_Occurred()) {
        return -1;
    }
    return v == expected;
}

/* getattr(fn, "__name__", type(fn).__name__) runs no code: the default's
 * look-up on type(fn) is type's own (its metaclass is type), and fn's is
 * generic with any __name__ on its type a plain value or a C getset/member;
 * a bound method (the eager backend's graph, gm.forward) forwards it to its
 * function where the method type has no __name__ (method_getattro). */
static int
name_lookup_is_pure(rt_disable_state *ds, PyObject *fn)
{
    if (!Py_IS_TYPE(Py_TYPE(fn), &PyType_Type)) {
        return 0;
    }
    if (PyMethod_Check(fn) && _PyType_Lookup(&PyMethod_Type, ds->str_name) == NULL) {
        fn = PyMethod_GET_FUNCTION(fn);
    }
    PyTypeObject *tp = Py_TYPE(fn);
    if (tp->tp_getattro != PyObject_GenericGetAttr) {
        return 0;
    }
    PyObject *d = _PyType_Lookup(tp, ds->str_name);
    return d == NULL || Py_TYPE(d)->tp_descr_get == NULL ||
           Py_IS_TYPE(d, &PyGetSetDescr_Type) || Py_IS_TYPE(d, &PyMemberDescr_Type);
}

int
rt_disable_fast_path(rt_disable_state *ds, PyObject *ctx_cell, PyObject *fn)
{
    PyObject *g = ds->eval_frame_globals;
    int ok;
    /* eval_frame's helpers, as _fn and _callback_from_stance look them up */
    if (!rt_dict_unchanged(g, ds->eval_frame_verified)) {
#define EXPECT(name, value)                                 \
    if ((ok = global_is(g, ds->name, value)) <= 0) {        \
        return ok < 0 ? -1 : RT_DISABLE_CALL_REPLACED;      \
    }
        EXPECT(str_set_eval_frame, ds->set_eval_frame)
        EXPECT(str_maybe_set_eval_frame, ds->set_eval_frame)
        EXPECT(str_callback_from_stance, ds->callback_from_stance)
        EXPECT(str_torch, ds->torch)
#undef EXPECT
        ds->eval_frame_verified = rt_dict_version(g);
    }
    /* _callback_from_stance(self.callback) is None */
    PyObject *ctx = PyCell_GET(ctx_cell);
    if (ctx == NULL || !Py_IS_TYPE(ctx, (PyTypeObject *)ds->DisableContext)) {
        return RT_DISABLE_CALL_STANCE;
    }
    PyObject *callback = PyObject_GetAttr(ctx, ds->str_callback);
    if (callback == NULL) {
        return -1;
    }
    Py_DECREF(callback);
    if (callback != Py_None) {
        return RT_DISABLE_CALL_STANCE;
    }
    PyObject *stance = PyDict_GetItemWithError(g, ds->str_stance_global);
    if (stance == NULL) {
        return PyErr_Occurred() ? -1 : RT_DISABLE_CALL_REPLACED;
    }
    PyObject *name = PyObject_GetAttr(stance, ds->str_stance);
    if (name == NULL) {
        return -1;
    }
    int is_default = PyUnicode_CheckExact(name) &&
                     PyUnicode_Compare(name, ds->str_default) == 0;
    Py_DECREF(name);
    if (!is_default) {
        return RT_DISABLE_CALL_STANCE;
    }
    /* torch.compiler.is_exporting() is False */
    PyObject *torch_dict = PyModule_GetDict(ds->torch); /* borrowed */
    if (!rt_dict_unchanged(torch_dict, ds->torch_verified)) {
        PyObject *compiler = PyObject_GetAttr(ds->torch, ds->str_compiler);
        if (compiler == NULL) {
            return -1;
        }
        Py_DECREF(compiler);
        if (compiler != ds->compiler) {
            return RT_DISABLE_CALL_REPLACED;
        }
        /* a module's attribute is its dict's entry unless its type says
         * otherwise: remembered only for the plain module type */
        if (Py_IS_TYPE(ds->torch, &PyModule_Type)) {
            ds->torch_verified = rt_dict_version(torch_dict);
        }
    }
    if (!rt_dict_unchanged(ds->compiler_globals, ds->compiler_verified)) {
        if ((ok = global_is(ds->compiler_globals, ds->str_is_exporting, ds->is_exporting)) <= 0) {
            return ok < 0 ? -1 : RT_DISABLE_CALL_REPLACED;
        }
        if ((ok = global_is(ds->compiler_globals, ds->str_is_exporting_flag, Py_False)) <= 0) {
            return ok < 0 ? -1 : RT_DISABLE_CALL_EXPORTING;
        }
        ds->compiler_verified = rt_dict_version(ds->compiler_globals);
    }
    /* 2.13 reads getattr(fn, "__name__", type(fn).__name__) first: only a
     * look-up that runs no code can be skipped */
    if (!ds->skips_none_callback && !name_lookup_is_pure(ds, fn)) {
        return RT_DISABLE_CALL_NAME;
    }
    return RT_DISABLE_CALL_C;
}

/* f(arg) as a `finally:` clause runs it: a pending exception survives it,
 * and one f raises replaces it (with it as __context__), as in Python;
 * *result is dropped when f fails. */
static void
finally_call(PyObject *f, PyObject *arg, PyObject **result)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = rt_call_one(f, arg);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_Restore(type, value, tb);
        return;
    }
    Py_CLEAR(*result);
    if (type == NULL) {
        return;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *type2, *value2, *tb2;
    PyErr_Fetch(&type2, &value2, &tb2);
    PyErr_NormalizeException(&type2, &value2, &tb2);
    if (value2 != value) {
        PyException_SetContext(value2, value); /* steals value */
    }
    else {
        Py_DECREF(value);
    }
    Py_DECREF(type);
    Py_XDECREF(tb);
    PyErr_Restore(type2, value2, tb2);
}

PyObject *
rt_disable_run(rt_disable_state *ds, rt_disable_body body, PyObject *fn, PyObject *const *argv,
               size_t nargsf, PyObject *kwnames)
{
    Py_INCREF(fn);
    PyObject *none = Py_None;
    PyObject *result = NULL;
    PyObject *prior = rt_call_one(ds->set_eval_frame, none);
    if (prior == NULL) {
        Py_DECREF(fn);
        return NULL;
    }
    if (!ds->skips_none_callback) {
        /* _maybe_set_eval_frame(None) */
        PyObject *r = rt_call_one(ds->set_eval_frame, none);
        if (r == NULL) {
            goto restore_prior;
        }
        Py_DECREF(r);
    }
    result = body(fn, argv, nargsf, kwnames);
    if (!ds->skips_none_callback) {
        finally_call(ds->set_eval_frame, Py_None, &result);
    }
restore_prior:
    if (!ds->skips_none_callback || prior != Py_None) {
        finally_call(ds->set_eval_frame, prior, &result);
    }
    Py_DECREF(prior);
    Py_DECREF(fn);
    return result;
}

/* fn is make_boxed_func's g (torch/_functorch/_aot_autograd/utils.py;
 * what inductor returns for a graph it leaves to the GraphModule, such as
 * a backward that only passes gradients through), called with one list or
 * tuple: its f (borrowed), whose call g's body makes, `f(*args)`; NULL
 * otherwise (g is called). */
static PyObject *
boxed_target(rt_disable_state *ds, PyObject *fn, PyObject *const *argv, size_t nargsf,
             PyObject *kwnames)
{
    /* (boxed_code None, or NULL unbound, is never fn's code) */
    if (!PyFunction_Check(fn) || PyFunction_GET_CODE(fn) != ds->boxed_code || kwnames != NULL ||
        PyVectorcall_NARGS(nargsf) != 1 ||
        !(PyList_CheckExact(argv[0]) || PyTuple_CheckExact(argv[0]))) {
        return NULL;
    }
    PyObject *closure = PyFunction_GET_CLOSURE(fn);
    if (closure == NULL || !PyTuple_Check(closure) || PyTuple_GET_SIZE(closure) != 1) {
        return NULL;
    }
    return PyCell_GET(PyTuple_GET_ITEM(closure, 0));
}

/* g's body: f(*args), the list copied to a tuple as the call unpacks it */
static PyObject *
call_unboxed(PyObject *f, PyObject *const *argv, size_t Py_UNUSED(nargsf),
             PyObject *Py_UNUSED(kwnames))
{
    PyObject *args = PyTuple_CheckExact(argv[0]) ? Py_NewRef(argv[0]) : PyList_AsTuple(argv[0]);
    if (args == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Call(f, args, NULL);
    Py_DECREF(args);
    return result;
}

static PyObject *
DisabledCall_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    DisabledCall *self = (DisabledCall *)op;
    rt_disable_state *ds = &self->st->dynamo.disable;
    PyObject *fn = PyCell_GET(self->fn_cell);
    int path = fn == NULL ? RT_DISABLE_CALL_REPLACED : rt_disable_fast_path(ds, self->ctx_cell, fn);
    if (path < 0) {
        return NULL;
    }
    ds->counts[path]++;
    if (path != RT_DISABLE_CALL_C) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *f = boxed_target(ds, fn, argv, nargsf, kwnames);
    if (f != NULL) {
        return rt_disable_run(ds, call_unboxed, f, argv, nargsf, kwnames);
    }
    return rt_disable_run(ds, PyObject_Vectorcall, fn, argv, nargsf, kwnames);
}

/* ---- construction ------------------------------------------------------ */

/* obj is DisableContext.__call__'s _fn, over a DisableContext */
static int
is_disable_wrapper(rt_disable_state *ds, PyObject *obj)
{
    if (!PyFunction_Check(obj) || PyFunction_GET_CODE(obj) != ds->fn_code ||
        PyFunction_GET_GLOBALS(obj) != ds->eval_frame_globals) {
        return 0;
    }
    PyObject *closure = PyFunction_GET_CLOSURE(obj);
    if (closure == NULL || !PyTuple_Check(closure) ||
        PyTuple_GET_SIZE(closure) <= Py_MAX(ds->fn_cell, ds->ctx_cell)) {
        return 0;
    }
    PyObject *ctx = PyCell_GET(PyTuple_GET_ITEM(closure, ds->ctx_cell));
    return ctx != NULL && Py_IS_TYPE(ctx, (PyTypeObject *)ds->DisableContext);
}

static PyObject *
disabled_call_new(PyTypeObject *type, PyObject *wrapper)
{
    DisabledCall *self = (DisabledCall *)rt_fn_alloc(type, DisabledCall_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    rt_disable_state *ds = &self->st->dynamo.disable;
    if (ds->fn_code == NULL || !is_disable_wrapper(ds, wrapper)) {
        PyErr_SetString(PyExc_TypeError,
                        ds->fn_code == NULL
                            ? "DisabledCall: _bind_disable() has not been called"
                            : "DisabledCall() takes a torch._dynamo.disable wrapper");
        Py_DECREF(self);
        return NULL;
    }
    PyObject *closure = PyFunction_GET_CLOSURE(wrapper);
    self->upstream = Py_NewRef(wrapper);
    self->fn_cell = Py_NewRef(PyTuple_GET_ITEM(closure, ds->fn_cell));
    self->ctx_cell = Py_NewRef(PyTuple_GET_ITEM(closure, ds->ctx_cell));
    return (PyObject *)self;
}

PyObject *
rt_disable_wrapper_for(rt_state *st, PyObject *compiled)
{
    rt_disable_state *ds = &st->dynamo.disable;
    if (ds->fn_code == NULL) {
        ds->counts[RT_DISABLE_UNBOUND]++;
        return Py_NewRef(compiled);
    }
    if (!is_disable_wrapper(ds, compiled)) {
        ds->counts[RT_DISABLE_NOT_WRAPPER]++;
        return Py_NewRef(compiled);
    }
    PyObject *w = disabled_call_new(st->dynamo.types.DisabledCallType, compiled);
    if (w != NULL) {
        ds->counts[RT_DISABLE_BUILT]++;
    }
    return w;
}

static PyObject *
DisabledCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *wrapper;
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) ||
        !PyArg_ParseTuple(args, "O:DisabledCall", &wrapper)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "DisabledCall() takes no keyword arguments");
        }
        return NULL;
    }
    return disabled_call_new(type, wrapper);
}

static int
DisabledCall_traverse(DisabledCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->fn_cell);
    Py_VISIT(self->ctx_cell);
    return 0;
}

static int
DisabledCall_clear(DisabledCall *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->fn_cell);
    Py_CLEAR(self->ctx_cell);
    return 0;
}

/* Attributes it lacks are the wrapper's (_torchdynamo_orig_callable,
 * __wrapped__, __name__, ...): code that unwraps or names it finds them. */
static PyObject *
DisabledCall_getattro(PyObject *op, PyObject *name)
{
    PyObject *v = PyObject_GenericGetAttr(op, name);
    if (v != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return v;
    }
    PyErr_Clear();
    return PyObject_GetAttr(((DisabledCall *)op)->upstream, name);
}

DEFINE_DEALLOC(DisabledCall, (void)0)
FN_MEMBERS(DisabledCall)

static PyType_Slot DisabledCall_slots[] = {
    {Py_tp_new, DisabledCall_new},
    {Py_tp_dealloc, DisabledCall_dealloc},
    {Py_tp_traverse, DisabledCall_traverse},
    {Py_tp_clear, DisabledCall_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, rt_fn_descr_get},
    {Py_tp_getattro, DisabledCall_getattro},
    {Py_tp_members, DisabledCall_members},
    {Py_tp_getset, rt_fn_getset},
    {Py_tp_doc, (void *)"DisabledCall(wrapper): what torch._dynamo.disable's wrapper "
                        "`wrapper` does when called, in C where the stance is the default "
                        "one and nothing exports; upstream's wrapper otherwise. Attributes "
                        "it lacks are the wrapper's."},
    {0, NULL},
};

PyType_Spec DisabledCall_spec = {
    .name = "torch_aot_rt._C.DisabledCall",
    .basicsize = sizeof(DisabledCall),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = DisabledCall_slots,
};

/* _C._disable_wrapper_for(obj): rt_disable_wrapper_for, for the shim
 * (Dynamo's compiled graphs, _disable.py) */
PyObject *
rt_disable_wrapper_for_py(PyObject *module, PyObject *obj)
{
    return rt_disable_wrapper_for(PyModule_GetState(module), obj);
}

/* ---- binding and counts ------------------------------------------------ */

#define DISABLE_OBJECTS(X)                                                    \
    X(fn_code) X(DisableContext) X(eval_frame_globals) X(torch) X(compiler)   \
    X(compiler_globals) X(set_eval_frame) X(callback_from_stance) X(is_exporting) \
    X(boxed_code)                                                             \
    X(str_callback) X(str_stance_global) X(str_stance) X(str_default)         \
    X(str_set_eval_frame) X(str_maybe_set_eval_frame) X(str_callback_from_stance) \
    X(str_torch) X(str_compiler) X(str_is_exporting) X(str_is_exporting_flag) \
    X(str_name)

int
rt_disable_traverse(rt_disable_state *ds, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(ds->f);
    DISABLE_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

void
rt_disable_clear(rt_disable_state *ds)
{
#define CLEAR(f) Py_CLEAR(ds->f);
    DISABLE_OBJECTS(CLEAR)
#undef CLEAR
    ds->eval_frame_verified = ds->compiler_verified = ds->torch_verified = 0;
}

PyObject *
rt_bind_disable(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"fn_code", "fn_cell", "ctx_cell", "DisableContext",
                               "eval_frame", "torch", "compiler", "set_eval_frame",
                               "callback_from_stance", "is_exporting",
                               "skips_none_callback", "boxed_code", NULL};
    PyObject *code, *cls, *eval_frame, *torch, *compiler, *set_eval_frame, *from_stance,
        *is_exporting, *boxed_code;
    Py_ssize_t fn_cell, ctx_cell;
    int skips;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$O!nnO!O!O!O!OOOpO:_bind_disable",
                                     keywords, &PyCode_Type, &code, &fn_cell, &ctx_cell,
                                     &PyType_Type, &cls, &PyModule_Type, &eval_frame,
                                     &PyModule_Type, &torch, &PyModule_Type, &compiler,
                                     &set_eval_frame, &from_stance, &is_exporting, &skips,
                                     &boxed_code)) {
        return NULL;
    }
    if (boxed_code != Py_None && !PyCode_Check(boxed_code)) {
        PyErr_SetString(PyExc_TypeError, "_bind_disable: boxed_code must be a code object or None");
        return NULL;
    }
    if (fn_cell < 0 || ctx_cell < 0) {
        PyErr_SetString(PyExc_ValueError, "_bind_disable: cell indices must be >= 0");
        return NULL;
    }
    rt_state *st = PyModule_GetState(module);
    rt_disable_state *ds = &st->dynamo.disable;
    rt_disable_clear(ds);
    static const rt_name_field names[] = {
        {offsetof(rt_disable_state, str_callback), "callback"},
        {offsetof(rt_disable_state, str_stance_global), "_stance"},
        {offsetof(rt_disable_state, str_stance), "stance"},
        {offsetof(rt_disable_state, str_default), "default"},
        {offsetof(rt_disable_state, str_set_eval_frame), "set_eval_frame"},
        {offsetof(rt_disable_state, str_maybe_set_eval_frame), "_maybe_set_eval_frame"},
        {offsetof(rt_disable_state, str_callback_from_stance), "_callback_from_stance"},
        {offsetof(rt_disable_state, str_torch), "torch"},
        {offsetof(rt_disable_state, str_compiler), "compiler"},
        {offsetof(rt_disable_state, str_is_exporting), "is_exporting"},
        {offsetof(rt_disable_state, str_is_exporting_flag), "_is_exporting_flag"},
        {offsetof(rt_disable_state, str_name), "__name__"},
    };
    if (rt_intern_names(ds, names, sizeof(names) / sizeof(names[0])) < 0) {
        rt_disable_clear(ds);
        return NULL;
    }
    ds->fn_cell = fn_cell;
    ds->ctx_cell = ctx_cell;
    ds->DisableContext = Py_NewRef(cls);
    ds->eval_frame_globals = Py_NewRef(PyModule_GetDict(eval_frame));
    ds->torch = Py_NewRef(torch);
    ds->compiler = Py_NewRef(compiler);
    ds->compiler_globals = Py_NewRef(PyModule_GetDict(compiler));
    ds->set_eval_frame = Py_NewRef(set_eval_frame);
    ds->callback_from_stance = Py_NewRef(from_stance);
    ds->is_exporting = Py_NewRef(is_exporting);
    ds->skips_none_callback = skips != 0;
    ds->boxed_code = Py_NewRef(boxed_code);
    ds->fn_code = Py_NewRef(code); /* last: it marks the state bound */
    Py_RETURN_NONE;
}

static const char *const count_names[RT_DISABLE_N] = {
    [RT_DISABLE_BUILT] = "built",
    [RT_DISABLE_NOT_WRAPPER] = "not a disable wrapper",
    [RT_DISABLE_UNBOUND] = "DisableContext not verified",
    [RT_DISABLE_CALL_C] = "calls in C",
    [RT_DISABLE_CALL_STANCE] = "upstream calls: a stance or callback",
    [RT_DISABLE_CALL_EXPORTING] = "upstream calls: exporting",
    [RT_DISABLE_CALL_REPLACED] = "upstream calls: eval_frame helpers replaced",
    [RT_DISABLE_CALL_NAME] = "upstream calls: fn.__name__ may run code",
};

PyObject *
rt_disable_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_disable_state *ds = &((rt_state *)PyModule_GetState(module))->dynamo.disable;
    return rt_counts_dict("_disable_stats", args, nargs, count_names, ds->counts, RT_DISABLE_N);
}
