/* tensor_ops.c: the runtime wrapper epilogue's tensor operations at the
 * torch door (declared in torch_api.h): copy_, as_strided_, set_ and the
 * alias view replay, through the C++ part where it takes them (counted by
 * route, rt_epi_route), else the tensor's Python methods. */
#include "torch_api.h"

/* x's methods are torch.Tensor's and no __torch_function__ override of
 * x's would take the call (what the C++ part may stand in for) */
static int
plain_tensor_type(rt_state *st, PyObject *x)
{
    rt_torch_state *t = rt_door(st);
    return Py_IS_TYPE(x, t->types.Tensor) || (t->parameter_plain && Py_IS_TYPE(x, t->types.Parameter));
}

/* The C++ part may run the method of a and b (torch_cpp_api.h epi_*):
 * plain tensor types and no TorchFunctionMode to hand the call to. */
int
rt_cpp_tensor_op_ok(rt_state *st, PyObject *a, PyObject *b)
{
    rt_torch_state *t = rt_door(st);
    if (t->cpp == NULL) {
        return 0;
    }
    if (plain_tensor_type(st, a) && plain_tensor_type(st, b) &&
        !t->cpp->torch_function_mode_enabled()) {
        return 1;
    }
    t->epi_counts[RT_EPI_NOT_OFFERED]++;
    return 0;
}

/* An epi_* result, counted: whether the C++ part answered (else the caller
 * takes the Python route). */
int
rt_cpp_answered(rt_state *st, int rc)
{
    rt_torch_state *t = rt_door(st);
    if (rc == RT_CPP_DECLINED) {
        t->epi_counts[RT_EPI_DECLINED]++;
        return 0;
    }
    t->epi_counts[RT_EPI_TAKEN]++;
    return 1;
}

static int
call_discard(rt_state *st, enum rt_tensor_method m, PyObject *self, PyObject *arg)
{
    PyObject *r = rt_tensor_call(st, m, self, &arg, 1);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

int
rt_tensor_copy_(rt_state *st, PyObject *orig, PyObject *src, int detach)
{
    if (rt_cpp_tensor_op_ok(st, orig, src)) {
        int rc = rt_door(st)->cpp->epi_copy_(orig, src, detach);
        if (rt_cpp_answered(st, rc)) {
            return rc;
        }
    }
    if (!detach) {
        return call_discard(st, RT_COPY_, orig, src);
    }
    PyObject *detached = rt_tensor_call(st, RT_DETACH, orig, NULL, 0);
    if (detached == NULL) {
        return -1;
    }
    int rc = call_discard(st, RT_COPY_, detached, src);
    Py_DECREF(detached);
    return rc;
}

int
rt_tensor_as_strided_like(rt_state *st, PyObject *orig, PyObject *like)
{
    if (rt_cpp_tensor_op_ok(st, orig, like)) {
        int rc = rt_door(st)->cpp->epi_as_strided_like(orig, like);
        if (rt_cpp_answered(st, rc)) {
            return rc;
        }
    }
    PyObject *geometry[3] = {NULL, NULL, NULL};
    int rc = -1;
    if ((geometry[0] = rt_tensor_call(st, RT_SIZE, like, NULL, 0)) == NULL ||
        (geometry[1] = rt_tensor_call(st, RT_STRIDE, like, NULL, 0)) == NULL ||
        (geometry[2] = rt_tensor_call(st, RT_STORAGE_OFFSET, like, NULL, 0)) == NULL) {
        goto done;
    }
    PyObject *r = rt_tensor_call(st, RT_AS_STRIDED_, orig, geometry, 3);
    if (r != NULL) {
        Py_DECREF(r);
        rc = 0;
    }
done:
    Py_XDECREF(geometry[0]);
    Py_XDECREF(geometry[1]);
    Py_XDECREF(geometry[2]);
    return rc;
}

int
rt_tensor_set_(rt_state *st, PyObject *orig, PyObject *src)
{
    if (rt_cpp_tensor_op_ok(st, orig, src)) {
        int rc = rt_door(st)->cpp->epi_set_(orig, src);
        if (rt_cpp_answered(st, rc)) {
            return rc;
        }
    }
    return call_discard(st, RT_SET_, orig, src);
}

int
rt_view_sequence_prepare(rt_state *st, PyObject *sequence, PyObject **out)
{
    rt_torch_state *t = rt_door(st);
    *out = NULL;
    if (t->cpp == NULL) {
        return 0;
    }
    *out = t->cpp->epi_view_sequence(sequence);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

int
rt_increment_version(rt_state *st, PyObject *tensors)
{
    PyObject *r = PyObject_Vectorcall(rt_door(st)->obj.increment_version, &tensors, 1, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

PyObject *
rt_unwrap_tensoralias(rt_state *st, PyObject *x)
{
    rt_torch_state *t = rt_door(st);
    int ok = PyObject_IsInstance(x, t->obj.TensorAlias);
    if (ok < 0) {
        return NULL;
    }
    if (!ok) {
        /* upstream: AssertionError(f"expected TensorAlias, got {type(x)}") */
        PyErr_Format(PyExc_AssertionError, "expected TensorAlias, got %S",
                     (PyObject *)Py_TYPE(x));
        return NULL;
    }
    return PyObject_GetAttr(x, t->obj.str_alias);
}

PyObject *
rt_unwrap_updated_input(rt_state *st, PyObject *x)
{
    rt_torch_state *t = rt_door(st);
    int ok = PyObject_IsInstance(x, t->obj.TensorAlias);
    if (ok < 0) {
        return NULL;
    }
    if (!ok) {
        /* 2.11/2.12 _RuntimeForwardEpilogue._apply_input_mutations: AssertionError(
         * f"expected TensorAlias for updated_inpt, got {type(updated_inpt)}") */
        PyErr_Format(PyExc_AssertionError, "expected TensorAlias for updated_inpt, got %S",
                     (PyObject *)Py_TYPE(x));
        return NULL;
    }
    return PyObject_GetAttr(x, t->obj.str_alias);
}

int
rt_mark_dynamic_indices(rt_state *st, PyObject *t, PyObject *dims, PyObject *name)
{
    /* if hasattr(t, name): t.name |= dims  else: t.name = dims.copy() */
    (void)st;
    PyObject *current = PyObject_GetAttr(t, name);
    if (current == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear(); /* hasattr() is False */
    }
    PyObject *updated;
    if (current != NULL) {
        updated = PyNumber_InPlaceOr(current, dims);
        Py_DECREF(current);
    }
    else {
        updated = PyObject_CallMethod(dims, "copy", NULL);
    }
    if (updated == NULL) {
        return -1;
    }
    int rc = PyObject_SetAttr(t, name, updated);
    Py_DECREF(updated);
    return rc;
}
