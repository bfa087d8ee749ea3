/* plan.c: validate the plan once, lay it out as C arrays. See plan.h. */
#include "plan.h"

static const char *const PLAN_KEYS[] = {
    "trace_joint", "disable_amp", "capture", "capture_order", "bump", "detach", "num_mutated",
    "expected_outs", "mutations", "outputs", "alias_translates_storage_offset", "dynamic_dims",
    "grad_enabled_mutation", "first_invocation", "disable_saved_tensors_hooks",
    "dynamic_dims_attr", "view_replay_forced", "args_list_check", "updated_alias_inline_check",
    "prologue_range_exited_on_error", "view_replay_set_on_enter", "bump_from_generator",
    NULL,
};

PyObject *
rt_plan_required(PyObject *kwargs, const char *key)
{
    PyObject *v = kwargs ? PyDict_GetItemString(kwargs, key) : NULL;
    if (v == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "plan: missing required keyword argument '%s'", key);
    }
    return v; /* borrowed */
}

static int
check_known_keys(PyObject *kwargs)
{
    if (kwargs == NULL) {
        return 0;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
        int known = 0;
        for (const char *const *k = PLAN_KEYS; *k && !known; k++) {
            known = PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, *k) == 0;
        }
        if (!known) {
            PyErr_Format(PyExc_TypeError,
                         "RuntimeWrapper() got an unexpected keyword argument %R", key);
            return -1;
        }
    }
    return 0;
}

int
rt_plan_bool(PyObject *kwargs, const char *key, bool *out)
{
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        return -1;
    }
    if (!PyBool_Check(v)) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be a bool, got %.100s",
                     key, Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = v == Py_True;
    return 0;
}

static int
as_index(PyObject *v, const char *what, Py_ssize_t limit, Py_ssize_t *out)
{
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be an int, got %.100s",
                     what, Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_ssize_t i = PyLong_AsSsize_t(v);
    if (i == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        i = -1;
    }
    if (i < 0 || (limit >= 0 && i >= limit)) {
        if (limit >= 0) {
            PyErr_Format(PyExc_ValueError, "plan: %s is %R, not in [0, %zd)",
                         what, v, limit);
        }
        else {
            PyErr_Format(PyExc_ValueError, "plan: %s is %R, must be >= 0", what, v);
        }
        return -1;
    }
    *out = i;
    return 0;
}

/* A sequence of non-negative ints -> a PyMem array. */
int
rt_plan_indices(PyObject *kwargs, const char *key, Py_ssize_t *n, Py_ssize_t **out)
{
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        return -1;
    }
    PyObject *seq = PySequence_Fast(v, "");
    if (seq == NULL) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be a sequence of ints", key);
        return -1;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    *out = PyMem_Calloc(len ? len : 1, sizeof(Py_ssize_t));
    if (*out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    *n = len;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (as_index(PySequence_Fast_GET_ITEM(seq, i), key, -1, &(*out)[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* None -> *out = NULL; a sequence of bools -> a PyMem array of *n flags. */
int
rt_plan_bool_mask(PyObject *kwargs, const char *key, Py_ssize_t *n, bool **out)
{
    *out = NULL;
    *n = 0;
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        return -1;
    }
    if (v == Py_None) {
        return 0;
    }
    PyObject *seq = PySequence_Fast(v, "");
    if (seq == NULL) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be None or a sequence of bools", key);
        return -1;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    bool *mask = PyMem_Calloc(len ? len : 1, sizeof(bool));
    if (mask == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBool_Check(b)) {
            PyErr_Format(PyExc_ValueError, "plan: %s must be None or a sequence of bools", key);
            PyMem_Free(mask);
            Py_DECREF(seq);
            return -1;
        }
        mask[i] = b == Py_True;
    }
    Py_DECREF(seq);
    *out = mask;
    *n = len;
    return 0;
}

/* A sequence of tuples of exactly `arity` items. */
static PyObject *
parse_records(PyObject *v, const char *key, Py_ssize_t arity)
{
    if (v == NULL) {
        return NULL; /* missing: required() raised */
    }
    PyObject *seq = PySequence_Fast(v, "");
    if (seq == NULL) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be a sequence of tuples", key);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != arity) {
            PyErr_Format(PyExc_ValueError,
                         "plan: %s[%zd] must be a tuple of %zd items, got %R",
                         key, i, arity, rec);
            Py_DECREF(seq);
            return NULL;
        }
    }
    return seq;
}

static int
parse_mutations(rt_plan *plan, PyObject *kwargs)
{
    PyObject *seq = parse_records(rt_plan_required(kwargs, "mutations"), "mutations", 3);
    if (seq == NULL) {
        return -1;
    }
    int rc = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != plan->num_mutated) {
        PyErr_Format(PyExc_ValueError,
                     "plan: %zd mutations for num_mutated=%zd", n, plan->num_mutated);
        goto done;
    }
    plan->mutations = PyMem_Calloc(n ? n : 1, sizeof(rt_mutation));
    if (plan->mutations == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t slot, kind, flags;
        if (as_index(PyTuple_GET_ITEM(rec, 0), "mutation slot", plan->n_capture, &slot) < 0 ||
            as_index(PyTuple_GET_ITEM(rec, 1), "mutation kind", RT_MUT_DATA + 1, &kind) < 0 ||
            as_index(PyTuple_GET_ITEM(rec, 2), "mutation flags", 16, &flags) < 0) {
            goto done;
        }
        if (flags != 0 && kind != RT_MUT_DATA) {
            PyErr_Format(PyExc_ValueError,
                         "plan: mutation %zd has flags %zd but kind %zd is not data",
                         i, flags, kind);
            goto done;
        }
        if ((flags & RT_MUT_LEAF) && (flags & RT_MUT_STREAM_ERROR)) {
            PyErr_Format(PyExc_ValueError,
                         "plan: mutation %zd cannot be both leaf and stream error", i);
            goto done;
        }
        if ((flags & RT_MUT_LEAF_STREAM_ERROR) && !(flags & RT_MUT_LEAF)) {
            PyErr_Format(PyExc_ValueError,
                         "plan: mutation %zd has a leaf stream error but is not a leaf", i);
            goto done;
        }
        plan->mutations[i] = (rt_mutation){slot, (uint8_t)kind, (uint8_t)flags};
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static int
parse_outputs(rt_plan *plan, PyObject *kwargs)
{
    PyObject *v = rt_plan_required(kwargs, "outputs");
    if (v == NULL) {
        return -1;
    }
    if (v == Py_None) {
        return 0;
    }
    PyObject *seq = parse_records(v, "outputs", 5);
    if (seq == NULL) {
        return -1;
    }
    int rc = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t n_fw = plan->expected_outs - plan->num_mutated;
    if (n > n_fw) {
        PyErr_Format(PyExc_ValueError,
                     "plan: %zd outputs but the compiled function returns only %zd "
                     "besides mutated inputs", n, n_fw);
        goto done;
    }
    plan->outputs = PyMem_Calloc(n ? n : 1, sizeof(rt_output));
    if (plan->outputs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    plan->n_outputs = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        rt_output *o = &plan->outputs[i];
        Py_ssize_t kind, index;
        if (as_index(PyTuple_GET_ITEM(rec, 0), "output kind",
                     RT_OUT_ALIAS_OF_INTERMEDIATE + 1, &kind) < 0) {
            goto done;
        }
        Py_ssize_t limit = (kind == RT_OUT_IS_INPUT || kind == RT_OUT_ALIAS_OF_INPUT)
                               ? plan->n_capture : n_fw;
        if (as_index(PyTuple_GET_ITEM(rec, 1), "output base index", limit, &index) < 0) {
            goto done;
        }
        PyObject *unwrap = PyTuple_GET_ITEM(rec, 2);
        PyObject *rg = PyTuple_GET_ITEM(rec, 3);
        if (!PyBool_Check(unwrap) || !PyBool_Check(rg)) {
            PyErr_Format(PyExc_ValueError,
                         "plan: outputs[%zd] unwrap_base and requires_grad must be bools", i);
            goto done;
        }
        o->kind = (uint8_t)kind;
        o->index = index;
        o->unwrap_base = unwrap == Py_True;
        o->requires_grad = Py_NewRef(rg);
        PyObject *replay = PyTuple_GET_ITEM(rec, 4);
        if (replay != Py_None) {
            if (!PyList_Check(replay) && !PyTuple_Check(replay)) {
                PyErr_Format(PyExc_ValueError,
                             "plan: outputs[%zd] replay sequence must be a list or None", i);
                goto done;
            }
            o->replay_sequence = Py_NewRef(replay);
        }
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static int
parse_dynamic_dims(rt_plan *plan, PyObject *kwargs)
{
    PyObject *seq = parse_records(rt_plan_required(kwargs, "dynamic_dims"), "dynamic_dims", 2);
    if (seq == NULL) {
        return -1;
    }
    int rc = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t n_ret = plan->outputs ? plan->n_outputs
                                       : plan->expected_outs - plan->num_mutated;
    plan->dynamic = PyMem_Calloc(n ? n : 1, sizeof(rt_dynamic_dims));
    if (plan->dynamic == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t out_index;
        if (as_index(PyTuple_GET_ITEM(rec, 0), "dynamic_dims output index", n_ret,
                     &out_index) < 0) {
            goto done;
        }
        PyObject *dims = PyTuple_GET_ITEM(rec, 1);
        if (!PyAnySet_Check(dims)) {
            PyErr_Format(PyExc_ValueError, "plan: dynamic_dims[%zd] must be a set", i);
            goto done;
        }
        plan->dynamic[i].out_index = out_index;
        plan->dynamic[i].dims = Py_NewRef(dims);
        plan->n_dynamic = i + 1;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

int
rt_plan_parse(rt_plan *plan, PyObject *compiled_fn, PyObject *kwargs)
{
    if (check_known_keys(kwargs) < 0) {
        return -1;
    }
    if (!PyCallable_Check(compiled_fn)) {
        PyErr_Format(PyExc_ValueError, "plan: compiled_fn must be callable, got %.100s",
                     Py_TYPE(compiled_fn)->tp_name);
        return -1;
    }
    plan->compiled_fn = Py_NewRef(compiled_fn);
    if (rt_plan_bool(kwargs, "trace_joint", &plan->trace_joint) < 0 ||
        rt_plan_bool(kwargs, "disable_amp", &plan->disable_amp) < 0 ||
        rt_plan_bool(kwargs, "disable_saved_tensors_hooks", &plan->disable_saved_hooks) < 0 ||
        rt_plan_bool(kwargs, "alias_translates_storage_offset",
                     &plan->alias_translates_storage_offset) < 0 ||
        rt_plan_bool(kwargs, "view_replay_forced", &plan->view_replay_forced) < 0 ||
        rt_plan_bool(kwargs, "view_replay_set_on_enter", &plan->view_replay_set_on_enter) < 0 ||
        rt_plan_bool(kwargs, "bump_from_generator", &plan->bump_from_generator) < 0 ||
        rt_plan_bool(kwargs, "args_list_check", &plan->args_list_check) < 0 ||
        rt_plan_bool(kwargs, "updated_alias_inline_check",
                     &plan->updated_alias_inline_check) < 0 ||
        rt_plan_bool(kwargs, "prologue_range_exited_on_error",
                     &plan->prologue_range_exited_on_error) < 0) {
        return -1;
    }
    PyObject *attr = rt_plan_required(kwargs, "dynamic_dims_attr");
    if (attr == NULL) {
        return -1;
    }
    if (!PyUnicode_CheckExact(attr)) {
        PyErr_SetString(PyExc_ValueError, "plan: dynamic_dims_attr must be a str");
        return -1;
    }
    plan->dynamic_attr = Py_NewRef(attr);
    PyUnicode_InternInPlace(&plan->dynamic_attr);
    if (rt_plan_indices(kwargs, "capture", &plan->n_capture, &plan->capture) < 0 ||
        rt_plan_indices(kwargs, "capture_order", &plan->n_capture_order,
                        &plan->capture_order) < 0 ||
        rt_plan_indices(kwargs, "bump", &plan->n_bump, &plan->bump) < 0 ||
        rt_plan_indices(kwargs, "detach", &plan->n_detach, &plan->detach) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < plan->n_capture; i++) {
        for (Py_ssize_t j = 0; j < i; j++) {
            if (plan->capture[i] == plan->capture[j]) {
                PyErr_Format(PyExc_ValueError, "plan: capture index %zd appears twice",
                             plan->capture[i]);
                return -1;
            }
        }
    }
    for (Py_ssize_t k = 0; k < plan->n_capture_order; k++) {
        Py_ssize_t s = 0;
        while (s < plan->n_capture && plan->capture[s] != plan->capture_order[k]) {
            s++;
        }
        if (s == plan->n_capture) {
            PyErr_Format(PyExc_ValueError,
                         "plan: capture_order index %zd is not in capture",
                         plan->capture_order[k]);
            return -1;
        }
    }
    if (plan->n_capture_order < plan->n_capture) {
        PyErr_SetString(PyExc_ValueError, "plan: capture_order must cover capture");
        return -1;
    }
    if (plan->n_detach && !plan->trace_joint) {
        PyErr_SetString(PyExc_ValueError, "plan: detach indices need trace_joint");
        return -1;
    }
    PyObject *v;
    if ((v = rt_plan_required(kwargs, "num_mutated")) == NULL ||
        as_index(v, "num_mutated", -1, &plan->num_mutated) < 0 ||
        (v = rt_plan_required(kwargs, "expected_outs")) == NULL ||
        as_index(v, "expected_outs", -1, &plan->expected_outs) < 0) {
        return -1;
    }
    if (plan->expected_outs < plan->num_mutated) {
        PyErr_Format(PyExc_ValueError, "plan: expected_outs=%zd < num_mutated=%zd",
                     plan->expected_outs, plan->num_mutated);
        return -1;
    }
    if (parse_mutations(plan, kwargs) < 0 || parse_outputs(plan, kwargs) < 0 ||
        parse_dynamic_dims(plan, kwargs) < 0) {
        return -1;
    }
    if ((v = rt_plan_required(kwargs, "grad_enabled_mutation")) == NULL) {
        return -1;
    }
    if (v != Py_None && !PyBool_Check(v)) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: grad_enabled_mutation must be None or a bool");
        return -1;
    }
    plan->grad_enabled_mutation = v == Py_None ? -1 : v == Py_True;
    return 0;
}

int
rt_plan_traverse(rt_plan *plan, visitproc visit, void *arg)
{
    Py_VISIT(plan->compiled_fn);
    for (Py_ssize_t i = 0; i < plan->n_outputs; i++) {
        Py_VISIT(plan->outputs[i].replay_sequence);
        Py_VISIT(plan->outputs[i].replay_cpp);
    }
    for (Py_ssize_t i = 0; i < plan->n_dynamic; i++) {
        Py_VISIT(plan->dynamic[i].dims);
    }
    return 0;
}

void
rt_plan_clear(rt_plan *plan)
{
    Py_CLEAR(plan->compiled_fn);
    Py_CLEAR(plan->dynamic_attr);
    if (plan->outputs) {
        for (Py_ssize_t i = 0; i < plan->n_outputs; i++) {
            Py_CLEAR(plan->outputs[i].requires_grad);
            Py_CLEAR(plan->outputs[i].replay_sequence);
            Py_CLEAR(plan->outputs[i].replay_cpp);
        }
    }
    if (plan->dynamic) {
        for (Py_ssize_t i = 0; i < plan->n_dynamic; i++) {
            Py_CLEAR(plan->dynamic[i].dims);
        }
    }
    PyMem_Free(plan->capture);
    PyMem_Free(plan->capture_order);
    PyMem_Free(plan->bump);
    PyMem_Free(plan->detach);
    PyMem_Free(plan->mutations);
    PyMem_Free(plan->outputs);
    PyMem_Free(plan->dynamic);
    plan->capture = plan->capture_order = plan->bump = plan->detach = NULL;
    plan->mutations = NULL;
    plan->outputs = NULL;
    plan->dynamic = NULL;
    plan->n_capture = plan->n_capture_order = plan->n_bump = plan->n_detach = 0;
    plan->n_outputs = plan->n_dynamic = 0;
    plan->num_mutated = 0;
}

int
rt_plan_constants_add(PyObject *module)
{
    /* what a plan is written with (torch_aot_rt/_kinds.py reads them) */
    static const struct {
        const char *name;
        int value;
    } constants[] = {
        {"MUT_SKIP", RT_MUT_SKIP}, {"MUT_SET", RT_MUT_SET}, {"MUT_METADATA", RT_MUT_METADATA},
        {"MUT_DATA", RT_MUT_DATA}, {"MUT_AS_STRIDED_FIRST", RT_MUT_AS_STRIDED_FIRST},
        {"MUT_LEAF", RT_MUT_LEAF}, {"MUT_STREAM_ERROR", RT_MUT_STREAM_ERROR},
        {"MUT_LEAF_STREAM_ERROR", RT_MUT_LEAF_STREAM_ERROR},
        {"OUT_PASS", RT_OUT_PASS}, {"OUT_IS_INPUT", RT_OUT_IS_INPUT},
        {"OUT_ALIAS_OF_INPUT", RT_OUT_ALIAS_OF_INPUT},
        {"OUT_ALIAS_OF_INTERMEDIATE", RT_OUT_ALIAS_OF_INTERMEDIATE},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++) {
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0) {
            return -1;
        }
    }
    return 0;
}
