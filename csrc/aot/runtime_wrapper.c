/* runtime_wrapper.c: AOTAutograd's runtime wrapper as a C callable.
 *
 * Mirrors upstream's _create_runtime_wrapper (runtime_wrappers.py): the
 * returned `runtime_wrapper(args)` with its profiler range, the generated
 * `_runtime_wrapper` (capture, version bump, first-invocation check,
 * _RuntimeCompiledFnInvoker.run for training and inference, epilogue), and
 * the `_disable_saved_tensors_hooks` layer around training wrappers.
 *
 * Everything that depends only on metadata lives in the rt_plan, decided when
 * the wrapper was built; a call walks its arrays and calls torch through
 * torch_api. Where the C version differs from the Python one on purpose:
 * - a truthy __exit__ of the first-invocation context does not swallow an
 *   exception (neither context upstream enters there ever returns one);
 * - inputs are captured into a C array, not a dict.
 */
#include "aot/runtime_wrapper.h"

#include <stddef.h>
#include <structmember.h>

#include "aot/epilogue.h"
#include "plan.h"

/* Captured inputs live on the C stack up to this many; beyond, PyMem. */
#define RT_CAPTURE_STACK 8

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    rt_state *st;
    PyObject *module;            /* keeps *st alive */
    /* upstream's _FirstInvocationContext, until a call consumes it */
    PyObject *first_invocation;
    PyObject *dict;              /* function-like attributes (functools.wraps) */
    PyObject *weakreflist;
    rt_plan plan;
} RuntimeWrapper;

/* ---- argument binding: def runtime_wrapper(args) ----------------------- */

/* The slow path of the call: what Python's binding of `def
 * runtime_wrapper(args)` accepts or raises. Returns a borrowed reference. */
static PyObject *
bind_args(RuntimeWrapper *self, PyObject *const *argv, Py_ssize_t nargs,
          PyObject *kwnames)
{
    PyObject *qualname = self->st->aot.obj.wrapper_qualname;
    PyObject *args = nargs >= 1 ? argv[0] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        if (PyUnicode_CompareWithASCIIString(name, "args") != 0) {
            PyErr_Format(PyExc_TypeError, "%U() got an unexpected keyword argument '%U'",
                         qualname, name);
            return NULL;
        }
        if (nargs >= 1) {
            PyErr_Format(PyExc_TypeError, "%U() got multiple values for argument 'args'",
                         qualname);
            return NULL;
        }
        args = argv[nargs + k];
    }
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError,
                     "%U() takes 1 positional argument but %zd were given",
                     qualname, nargs);
        return NULL;
    }
    if (args == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%U() missing 1 required positional argument: 'args'", qualname);
    }
    return args;
}

/* args[i], new reference: the exact-list fast path, else Python's subscript
 * (a list subclass may override __getitem__; upstream would call it). */
static PyObject *
arg_at(PyObject *args, Py_ssize_t i)
{
    if (PyList_CheckExact(args)) {
        if (i >= PyList_GET_SIZE(args)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            return NULL;
        }
        return Py_NewRef(PyList_GET_ITEM(args, i));
    }
    PyObject *key = PyLong_FromSsize_t(i);
    if (key == NULL) {
        return NULL;
    }
    PyObject *item = PyObject_GetItem(args, key);
    Py_DECREF(key);
    return item;
}

/* 2.11/2.12's increment_version((args[i] for i in ...)): the C++ binding
 * iterates the generator, bumping each tensor as it comes, so a read that
 * raises leaves the earlier ones bumped. The binding then returns None with
 * that exception set: CPython's generic call path turns it into SystemError
 * ("... returned a result with an exception set"), a specialised call site
 * (once torch's increment_version is warm) lets the exception itself
 * surface a few instructions later. We raise the exception itself, the
 * steady state (docs/compatibility.md). */
static int
bump_versions_lazily(rt_state *st, const rt_plan *p, PyObject *args)
{
    for (Py_ssize_t k = 0; k < p->n_bump; k++) {
        PyObject *t = arg_at(args, p->bump[k]);
        if (t == NULL) {
            return -1;
        }
        PyObject *one = PyTuple_Pack(1, t);
        Py_DECREF(t);
        if (one == NULL || rt_increment_version(st, one) < 0) {
            Py_XDECREF(one);
            return -1;
        }
        Py_DECREF(one);
    }
    return 0;
}

/* _codegen_increment_mutation_versions: increment_version((args[i], ...)) */
static int
bump_versions(rt_state *st, const rt_plan *p, PyObject *args)
{
    if (p->bump_from_generator) {
        return bump_versions_lazily(st, p, args);
    }
    PyObject *tensors = PyTuple_New(p->n_bump);
    if (tensors == NULL) {
        return -1;
    }
    for (Py_ssize_t k = 0; k < p->n_bump; k++) {
        PyObject *t = arg_at(args, p->bump[k]);
        if (t == NULL) {
            Py_DECREF(tensors);
            return -1;
        }
        PyTuple_SET_ITEM(tensors, k, t);
    }
    int rc = rt_increment_version(st, tensors);
    Py_DECREF(tensors);
    return rc;
}

/* ---- the call of the compiled function --------------------------------- */

/* _on_before_call_(); [with _DisableAutocast():] all_outs = compiled_fn(args);
 * normalised as a list (_codegen_normalize_as_list). */
static PyObject *
call_compiled(RuntimeWrapper *self, PyObject *args, PyObject **range)
{
    rt_state *st = self->st;
    if (rt_prologue_range_exit(st, range) < 0) {
        return NULL;
    }
    /* 2.11/2.12: call_func_at_runtime_with_args(compiled_fn, args,
     * steal_args=True) checks what it was given (only the inference call can
     * fail it: training passes a fresh list) */
    if (self->plan.args_list_check && !PyList_Check(args)) {
        PyErr_Format(PyExc_AssertionError, "args must be a list, got %S",
                     (PyObject *)Py_TYPE(args));
        return NULL;
    }
    /* steal_args: the compiled function owns the list and may clear it, so
     * that inputs die as early as the graph allows. We keep no extra
     * reference to them beyond the captured ones. */
    return rt_call_boxed(st, self->plan.compiled_fn, args, self->plan.disable_amp);
}

/* _RuntimeCompiledFnInvoker.run, trace_joint=False: grad off for the call. */
static PyObject *
call_inference(RuntimeWrapper *self, PyObject *args, PyObject **range)
{
    rt_state *st = self->st;
    int grad = rt_grad_enabled(st);
    if (grad < 0) {
        return NULL;
    }
    PyObject *out = NULL;
    if (!grad || rt_set_grad_enabled(st, 0) == 0) {
        out = call_compiled(self, args, range);
    }
    if (grad) {
        rt_pending_error saved;
        rt_finally_begin(&saved);
        int ok = rt_set_grad_enabled(st, 1) == 0;
        if (rt_finally_end(&saved, ok) < 0) {
            Py_CLEAR(out);
        }
    }
    return out;
}

/* `with torch.enable_grad(): _on_before_call_(); all_outs = ...` */
static PyObject *
call_with_grad(RuntimeWrapper *self, PyObject *args_, PyObject **range)
{
    rt_state *st = self->st;
    int prev_grad = rt_grad_enabled(st);
    if (prev_grad < 0 || rt_set_grad_enabled(st, 1) < 0) {
        return NULL;
    }
    PyObject *out = call_compiled(self, args_, range);
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = rt_set_grad_enabled(st, prev_grad) == 0;
    if (rt_finally_end(&saved, ok) < 0) {
        Py_CLEAR(out);
    }
    return out;
}

/* 2.11/2.12's _RuntimeCompiledFnInvoker.run (2.11: inline in runtime_wrapper),
 * trace_joint=True, from the detached list on: `with
 * (torch.autograd._force_original_view_tracking(True), torch.enable_grad()):`.
 * The context's __init__ reads the mode and sets it, __enter__ sets it again
 * (2.12; 2.11's __enter__ is `pass`), __exit__ puts the read mode back
 * whatever the mode is then (each a call a TorchFunctionMode sees). Steals
 * args_. */
static PyObject *
call_training_forced(RuntimeWrapper *self, PyObject *args_, PyObject **range)
{
    rt_state *st = self->st;
    PyObject *out = NULL;
    int prev_view_replay = rt_view_replay_enabled(st);
    if (prev_view_replay < 0 ||
        rt_set_view_replay_enabled(st, 1) < 0 ||   /* __init__ */
        (self->plan.view_replay_set_on_enter &&
         rt_set_view_replay_enabled(st, 1) < 0)) { /* __enter__: no __exit__ if it fails */
        Py_DECREF(args_);
        return NULL;
    }
    out = call_with_grad(self, args_, range);
    Py_DECREF(args_);
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = rt_set_view_replay_enabled(st, prev_view_replay) == 0; /* __exit__ */
    if (rt_finally_end(&saved, ok) < 0) {
        Py_CLEAR(out);
    }
    return out;
}

/* _RuntimeCompiledFnInvoker.run, trace_joint=True: a fresh args list with
 * the never-differentiated inputs detached, view replay on, grad on. */
static PyObject *
call_training(RuntimeWrapper *self, PyObject *args, PyObject **range)
{
    rt_state *st = self->st;
    const rt_plan *p = &self->plan;
    PyObject *args_ = PySequence_List(args);
    if (args_ == NULL) {
        return NULL;
    }
    /* See Note [Detaching inputs that never need gradients] upstream. */
    for (Py_ssize_t k = 0; k < p->n_detach; k++) {
        PyObject *item = arg_at(args_, p->detach[k]);
        if (item == NULL) {
            goto fail;
        }
        int is_tensor = rt_is_tensor(st, item);
        PyObject *detached = is_tensor > 0 ? rt_tensor_call(st, RT_DETACH, item, NULL, 0)
                                           : NULL;
        Py_DECREF(item);
        if (is_tensor < 0 || (is_tensor && detached == NULL)) {
            goto fail;
        }
        if (is_tensor && PyList_SetItem(args_, p->detach[k], detached) < 0) {
            goto fail;
        }
    }

    if (p->view_replay_forced) {
        return call_training_forced(self, args_, range);
    }
    int prev_view_replay = rt_view_replay_enabled(st);
    if (prev_view_replay < 0) {
        goto fail;
    }
    PyObject *out = NULL;
    if (prev_view_replay || rt_set_view_replay_enabled(st, 1) == 0) {
        out = call_with_grad(self, args_, range);
    }
    Py_CLEAR(args_);
    /* finally: restore view replay if it differs */
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int now = rt_view_replay_enabled(st);
    int ok = now >= 0 &&
             (now == prev_view_replay ||
              rt_set_view_replay_enabled(st, prev_view_replay) == 0);
    if (rt_finally_end(&saved, ok) < 0) {
        Py_CLEAR(out);
    }
    return out;

fail:
    Py_DECREF(args_);
    return NULL;
}

/* `with _first_ctx_():` around the invocation: the custom-op aliasing check
 * of the first call (_FirstInvocationContext). Once the context reports it
 * handed out its check, it is dropped and later calls skip it. */
static PyObject *
invoke(RuntimeWrapper *self, PyObject *args, PyObject **range)
{
    rt_state *st = self->st;
    PyObject *first_cm = NULL;
    if (self->first_invocation != NULL) {
        PyObject *first = Py_NewRef(self->first_invocation);
        first_cm = PyObject_CallNoArgs(first);
        if (first_cm != NULL) {
            PyObject *pending = PyObject_GetAttr(first, st->aot.obj.str_is_first);
            int still = pending ? PyObject_IsTrue(pending) : -1;
            Py_XDECREF(pending);
            if (still < 0) {
                Py_CLEAR(first_cm);
            }
            else if (!still && self->first_invocation == first) {
                Py_CLEAR(self->first_invocation);
            }
        }
        Py_DECREF(first);
        if (first_cm == NULL) {
            return NULL;
        }
        if (rt_context_enter(st, first_cm) < 0) {
            Py_DECREF(first_cm);
            return NULL;
        }
    }
    PyObject *out = self->plan.trace_joint ? call_training(self, args, range)
                                           : call_inference(self, args, range);
    if (first_cm != NULL) {
        if (rt_context_exit(st, first_cm, out == NULL) < 0) {
            Py_CLEAR(out);
        }
        Py_DECREF(first_cm);
    }
    return out;
}

/* The dict comprehension's reads, one per epilogue index, duplicates
 * included (the last read of an index wins), for an `args` whose
 * __getitem__ may be Python code. Fills every slot or none. */
static int
capture_every_read(const rt_plan *p, PyObject *args, PyObject **captured)
{
    for (Py_ssize_t s = 0; s < p->n_capture; s++) {
        captured[s] = NULL;
    }
    for (Py_ssize_t k = 0; k < p->n_capture_order; k++) {
        Py_ssize_t s = 0;
        while (p->capture[s] != p->capture_order[k]) {
            s++; /* present: plan.c checked capture_order against capture */
        }
        PyObject *item = arg_at(args, p->capture_order[k]);
        if (item == NULL) {
            for (Py_ssize_t t = 0; t < p->n_capture; t++) {
                Py_CLEAR(captured[t]);
            }
            return -1;
        }
        Py_XSETREF(captured[s], item);
    }
    return 0;
}

/* runtime_wrapper(args) and the generated _runtime_wrapper it calls. */
static PyObject *
run(RuntimeWrapper *self, PyObject *args)
{
    rt_state *st = self->st;
    const rt_plan *p = &self->plan;
    PyObject *stack_captured[RT_CAPTURE_STACK];
    PyObject **captured = stack_captured;
    Py_ssize_t n_captured = 0;
    PyObject *all_outs = NULL, *result = NULL;
    PyObject *range;

    if (rt_prologue_range_enter(st, &range) < 0) {
        return NULL;
    }
    if (p->n_capture > RT_CAPTURE_STACK) {
        captured = PyMem_Malloc(p->n_capture * sizeof(PyObject *));
        if (captured == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    /* orig_inputs = {i: args[i] for i in epilogue_args_idx} */
    if (PyList_CheckExact(args) || p->n_capture_order == p->n_capture) {
        for (; n_captured < p->n_capture; n_captured++) {
            captured[n_captured] = arg_at(args, p->capture[n_captured]);
            if (captured[n_captured] == NULL) {
                goto done;
            }
        }
    }
    else if (capture_every_read(p, args, captured) < 0) {
        goto done;
    }
    else {
        n_captured = p->n_capture;
    }
    if (p->n_bump > 0 && bump_versions(st, p, args) < 0) {
        goto done;
    }
    all_outs = invoke(self, args, &range);
    if (all_outs != NULL) {
        result = rt_finalize(st, p, captured, all_outs);
    }
done:
    Py_XDECREF(all_outs);
    for (Py_ssize_t i = 0; i < n_captured; i++) {
        Py_DECREF(captured[i]);
    }
    if (captured != stack_captured) {
        PyMem_Free(captured);
    }
    /* finally: exit_prologue(), if the call never got that far (2.11: no
     * finally, the range is dropped with the frame) */
    if (range != NULL) {
        if (!p->prologue_range_exited_on_error) {
            Py_CLEAR(range);
        }
        else if (rt_prologue_range_exit(st, &range) < 0) {
            Py_CLEAR(result);
        }
    }
    return result;
}

static PyObject *
RuntimeWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                          PyObject *kwnames)
{
    RuntimeWrapper *self = (RuntimeWrapper *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *args = (nargs == 1 && kwnames == NULL)
                         ? argv[0] : bind_args(self, argv, nargs, kwnames);
    if (args == NULL) {
        return NULL;
    }
    if (self->plan.compiled_fn == NULL) { /* cleared by the GC */
        PyErr_SetString(PyExc_RuntimeError, "RuntimeWrapper was cleared");
        return NULL;
    }
    if (!self->plan.disable_saved_hooks) {
        return run(self, args);
    }
    /* with _disable_saved_tensors_hooks(): the hooks were inlined into the
     * graphs; any hook pushed during the call is an error. */
    rt_state *st = self->st;
    PyObject *previous = rt_saved_hooks_disable(st);
    if (previous == NULL) {
        return NULL;
    }
    PyObject *result = run(self, args);
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = rt_saved_hooks_restore(st, previous) == 0;
    if (rt_finally_end(&saved, ok) < 0) {
        Py_CLEAR(result);
    }
    return result;
}

/* ---- type slots --------------------------------------------------------- */

static PyObject *
RuntimeWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *module = PyType_GetModule(type);
    if (module == NULL) {
        return NULL;
    }
    rt_state *st = PyModule_GetState(module);
    if (!st->torch.bound) {
        PyErr_SetString(PyExc_RuntimeError,
                        "torch_aot_rt._C: _bind_torch() must be called before "
                        "building a RuntimeWrapper");
        return NULL;
    }
    PyObject *compiled_fn;
    if (!PyArg_ParseTuple(args, "O:RuntimeWrapper", &compiled_fn)) {
        return NULL;
    }
    RuntimeWrapper *self = (RuntimeWrapper *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = RuntimeWrapper_vectorcall;
    self->st = st;
    self->module = Py_NewRef(module);
    if (rt_plan_parse(&self->plan, compiled_fn, kwargs) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    /* The view-replay sequences in the C++ part's form, once. */
    for (Py_ssize_t i = 0; self->plan.outputs != NULL && i < self->plan.n_outputs; i++) {
        rt_output *o = &self->plan.outputs[i];
        if (o->replay_sequence != NULL &&
            rt_view_sequence_prepare(st, o->replay_sequence, &o->replay_cpp) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    PyObject *first = PyDict_GetItemString(kwargs, "first_invocation"); /* borrowed */
    if (first == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "RuntimeWrapper() missing required keyword argument "
                        "'first_invocation'");
        Py_DECREF(self);
        return NULL;
    }
    if (first != Py_None) {
        if (!PyCallable_Check(first)) {
            PyErr_SetString(PyExc_ValueError,
                            "plan: first_invocation must be callable or None");
            Py_DECREF(self);
            return NULL;
        }
        self->first_invocation = Py_NewRef(first);
    }
    return (PyObject *)self;
}

static int
RuntimeWrapper_traverse(RuntimeWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->first_invocation);
    Py_VISIT(self->dict);
    return rt_plan_traverse(&self->plan, visit, arg);
}

static int
RuntimeWrapper_clear(RuntimeWrapper *self)
{
    Py_CLEAR(self->first_invocation);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->plan.compiled_fn);
    return 0;
}

static void
RuntimeWrapper_dealloc(RuntimeWrapper *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    RuntimeWrapper_clear(self);
    rt_plan_clear(&self->plan);
    Py_CLEAR(self->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Bound like a Python function when stored on a class, as upstream's
 * runtime_wrapper would be. */
static PyObject *
RuntimeWrapper_descr_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
RuntimeWrapper_repr(RuntimeWrapper *self)
{
    return PyUnicode_FromFormat(
        "<torch_aot_rt RuntimeWrapper %s, %zd outputs, %zd mutated inputs, "
        "aliases %s>",
        self->plan.trace_joint ? "training" : "inference",
        self->plan.expected_outs - self->plan.num_mutated, self->plan.num_mutated,
        self->plan.outputs ? "replayed" : "none");
}

static PyMemberDef RuntimeWrapper_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(RuntimeWrapper, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(RuntimeWrapper, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(RuntimeWrapper, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
RuntimeWrapper_get_compiled_fn(RuntimeWrapper *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->plan.compiled_fn ? self->plan.compiled_fn : Py_None);
}

static PyGetSetDef RuntimeWrapper_getset[] = {
    {"compiled_fn", (getter)RuntimeWrapper_get_compiled_fn, NULL,
     "the boxed compiled function this wrapper calls", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(RuntimeWrapper_doc,
"RuntimeWrapper(compiled_fn, **plan)\n--\n\n"
"AOTAutograd's runtime wrapper (upstream _create_runtime_wrapper) in C.\n"
"Built by torch_aot_rt._plan from ViewAndMutationMeta; called with the\n"
"boxed list of arguments, which the compiled function may clear.");

static PyType_Slot RuntimeWrapper_slots[] = {
    {Py_tp_new, RuntimeWrapper_new},
    {Py_tp_dealloc, RuntimeWrapper_dealloc},
    {Py_tp_traverse, RuntimeWrapper_traverse},
    {Py_tp_clear, RuntimeWrapper_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, RuntimeWrapper_descr_get},
    {Py_tp_repr, RuntimeWrapper_repr},
    {Py_tp_members, RuntimeWrapper_members},
    {Py_tp_getset, RuntimeWrapper_getset},
    {Py_tp_doc, (void *)RuntimeWrapper_doc},
    {0, NULL},
};

static PyType_Spec RuntimeWrapper_spec = {
    .name = "torch_aot_rt._C.RuntimeWrapper",
    .basicsize = sizeof(RuntimeWrapper),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = RuntimeWrapper_slots,
};

PyTypeObject *
rt_runtime_wrapper_type_new(PyObject *module)
{
    return (PyTypeObject *)PyType_FromModuleAndSpec(module, &RuntimeWrapper_spec, NULL);
}
