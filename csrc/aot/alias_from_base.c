/* alias_from_base.c: functional_utils.gen_alias_from_base in C: the
 * view-replay branch (rt_alias_by_view_replay) and the others
 * (rt_alias_from_base).
 *
 * The alias replay of the runtime wrapper regenerates an output that aliases
 * an input (or an intermediate) from its base. Without a recorded ViewMeta
 * sequence (a tensor subclass's outputs, replay_views off, a sequence with
 * symbolic inputs) upstream replays the traced output's autograd view
 * function on the base (`target._view_func(base)`), reshaping the base with
 * as_strided first when its geometry differs from the traced base's, and
 * falls back to as_strided on the target's geometry. Everything here is a
 * Python-level call on the tensors, in upstream's order and number (a
 * TorchFunctionMode or a subclass's __torch_function__ sees the same calls);
 * only the Python frames of gen_alias_from_base and patch_requires_grad are
 * gone.
 */
#include "state.h"

/* gen_alias_from_base's patch_requires_grad(out); steals `out`:
 *   if base.requires_grad and not target_requires_grad: out = out.detach()
 *   elif not base.requires_grad and target_requires_grad: out.requires_grad_(True)
 * base.requires_grad is read again whenever the first test fails. */
PyObject *
rt_patch_requires_grad(rt_state *st, PyObject *base, PyObject *out, int target_requires_grad)
{
    int base_rg = rt_tensor_requires_grad(st, base);
    if (base_rg < 0) {
        goto fail;
    }
    if (base_rg && !target_requires_grad) {
        Py_SETREF(out, rt_tensor_call(st, RT_DETACH, out, NULL, 0));
        return out;
    }
    base_rg = rt_tensor_requires_grad(st, base);
    if (base_rg < 0) {
        goto fail;
    }
    if (!base_rg && target_requires_grad) {
        PyObject *arg = Py_True;
        PyObject *r = rt_tensor_call(st, RT_REQUIRES_GRAD_, out, &arg, 1);
        if (r == NULL) {
            goto fail;
        }
        Py_DECREF(r);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* upstream's AssertionError, its message reading both shapes again:
 * f"... {tuple(out.shape)} (actual) vs {tuple(target_meta_tensor.shape)} (expected)" */
static void
shape_mismatch_error(rt_state *st, PyObject *out, PyObject *target)
{
    PyObject *shapes[2] = {NULL, NULL};
    PyObject *objs[2] = {out, target};
    for (int k = 0; k < 2; k++) {
        PyObject *shape = PyObject_GetAttr(objs[k], st->aot.obj.str_shape);
        shapes[k] = shape ? PySequence_Tuple(shape) : NULL;
        Py_XDECREF(shape);
        if (shapes[k] == NULL) {
            Py_XDECREF(shapes[0]);
            return;
        }
    }
    PyErr_Format(PyExc_AssertionError,
                 "incorrect out shape after application of ViewMeta sequence: "
                 "%R (actual) vs %R (expected)", shapes[0], shapes[1]);
    Py_DECREF(shapes[0]);
    Py_DECREF(shapes[1]);
}

PyObject *
rt_alias_by_view_replay(rt_state *st, PyObject *base, PyObject *target,
                        int requires_grad, PyObject *sequence, PyObject *sequence_cpp)
{
    /* Upstream's branch reads out.shape, target.shape and base.requires_grad
     * (getters a TorchFunctionMode takes) and calls out.detach(). */
    if (sequence_cpp == NULL) {
        if (st->torch.cpp != NULL) {
            st->torch.epi_counts[RT_EPI_NOT_OFFERED]++;
        }
    }
    else if (rt_cpp_tensor_op_ok(st, base, target)) {
        PyObject *out = NULL;
        int rc = st->torch.cpp->epi_view_replay(sequence_cpp, base, target, requires_grad, &out);
        if (rt_cpp_answered(st, rc)) {
            return out;
        }
    }
    PyObject *argv[2] = {base, sequence};
    PyObject *out = PyObject_Vectorcall(st->aot.obj.apply_view_meta_sequence, argv, 2, NULL);
    if (out == NULL) {
        return NULL;
    }
    /* if out.shape != target_meta_tensor.shape: raise AssertionError (the
     * getters, as upstream reads them: a TorchFunctionMode sees them) */
    PyObject *out_shape = PyObject_GetAttr(out, st->aot.obj.str_shape);
    PyObject *target_shape = out_shape ? PyObject_GetAttr(target, st->aot.obj.str_shape) : NULL;
    int same = target_shape ? PyObject_RichCompareBool(out_shape, target_shape, Py_EQ) : -1;
    Py_XDECREF(out_shape);
    Py_XDECREF(target_shape);
    if (same == 0) {
        shape_mismatch_error(st, out, target);
    }
    if (same <= 0) {
        Py_DECREF(out);
        return NULL;
    }
    return rt_patch_requires_grad(st, base, out, requires_grad);
}

/* `a.name <op> b.name` as a C truth value (1, 0, -1 on error): both
 * attributes read as upstream reads them, a first, b only if a succeeded */
static int
attrs_compare(PyObject *a, PyObject *b, PyObject *name, int op)
{
    PyObject *va = PyObject_GetAttr(a, name);
    PyObject *vb = va ? PyObject_GetAttr(b, name) : NULL;
    PyObject *r = vb ? PyObject_RichCompare(va, vb, op) : NULL;
    int v = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(va);
    Py_XDECREF(vb);
    Py_XDECREF(r);
    return v;
}

/* `a.m() != b.m()` for m in (size, stride, storage_offset), short-circuit
 * as upstream's `or` chain: 1 if one differs, 0 if none, -1 on error. */
static int
geometry_differs(rt_state *st, PyObject *a, PyObject *b)
{
    static const enum rt_tensor_method methods[3] = {RT_SIZE, RT_STRIDE, RT_STORAGE_OFFSET};
    for (int k = 0; k < 3; k++) {
        PyObject *va = rt_tensor_call(st, methods[k], a, NULL, 0);
        if (va == NULL) {
            return -1;
        }
        PyObject *vb = rt_tensor_call(st, methods[k], b, NULL, 0);
        if (vb == NULL) {
            Py_DECREF(va);
            return -1;
        }
        PyObject *ne = PyObject_RichCompare(va, vb, Py_NE);
        Py_DECREF(va);
        Py_DECREF(vb);
        int differs = ne ? PyObject_IsTrue(ne) : -1;
        Py_XDECREF(ne);
        if (differs != 0) {
            return differs;
        }
    }
    return 0;
}

/* t.as_strided(src.size(), src.stride(), src.storage_offset()) */
static PyObject *
as_strided_like(rt_state *st, PyObject *t, PyObject *src)
{
    PyObject *argv[4] = {t, NULL, NULL, NULL};
    PyObject *out = NULL;
    if ((argv[1] = rt_tensor_call(st, RT_SIZE, src, NULL, 0)) == NULL ||
        (argv[2] = rt_tensor_call(st, RT_STRIDE, src, NULL, 0)) == NULL ||
        (argv[3] = rt_tensor_call(st, RT_STORAGE_OFFSET, src, NULL, 0)) == NULL) {
        goto done;
    }
    out = PyObject_VectorcallMethod(st->aot.alias.str_as_strided, argv,
                                    4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
done:
    Py_XDECREF(argv[1]);
    Py_XDECREF(argv[2]);
    Py_XDECREF(argv[3]);
    return out;
}

/* The view-function branch: `b = target._base` is not None. A new reference
 * to the patched output, or NULL without an exception when upstream falls
 * through to as_strided (no output, or the wrong shape: an autograd
 * view-tracking bug upstream works around), or NULL with one. */
static PyObject *
alias_by_view_func(rt_state *st, PyObject *abt, PyObject *target, PyObject *b,
                   int target_requires_grad)
{
    PyObject *reshaped;
    if (abt != b) {
        int differs = geometry_differs(st, abt, b);
        if (differs < 0) {
            return NULL;
        }
        reshaped = differs ? as_strided_like(st, abt, b) : Py_NewRef(abt);
    }
    else {
        reshaped = Py_NewRef(abt);
    }
    if (reshaped == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_CallMethodOneArg(target, st->aot.alias.str_view_func, reshaped);
    Py_DECREF(reshaped);
    if (out == NULL) {
        return NULL;
    }
    if (out == Py_None) {
        Py_DECREF(out);
        return NULL;
    }
    int same = attrs_compare(out, target, st->aot.obj.str_shape, Py_EQ);
    if (same <= 0) {
        Py_DECREF(out);
        return NULL;
    }
    return rt_patch_requires_grad(st, abt, out, target_requires_grad);
}

/* t.is_complex() as a C truth value */
static int
is_complex(rt_state *st, PyObject *t)
{
    PyObject *r = PyObject_CallMethodNoArgs(t, st->aot.alias.str_is_complex);
    int v = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    return v;
}

/* `abt.untyped_storage()._cdata != target.untyped_storage()._cdata` (2.14) */
static int
other_storage(rt_state *st, PyObject *abt, PyObject *target)
{
    PyObject *sa = NULL, *sb = NULL, *ca = NULL, *cb = NULL;
    int r = -1;
    if ((sa = PyObject_CallMethodNoArgs(abt, st->aot.alias.str_untyped_storage)) == NULL ||
        (ca = PyObject_GetAttr(sa, st->aot.alias.str_cdata)) == NULL ||
        (sb = PyObject_CallMethodNoArgs(target, st->aot.alias.str_untyped_storage)) == NULL ||
        (cb = PyObject_GetAttr(sb, st->aot.alias.str_cdata)) == NULL) {
        goto done;
    }
    r = PyObject_RichCompareBool(ca, cb, Py_NE);
done:
    Py_XDECREF(sa);
    Py_XDECREF(sb);
    Py_XDECREF(ca);
    Py_XDECREF(cb);
    return r;
}

/* The as_strided fallback: the target's geometry on the base (through
 * view_as_real / view_as_complex when exactly one of them is complex),
 * requires_grad patched, then a dtype view when the dtypes differ. */
static PyObject *
alias_by_as_strided(rt_state *st, PyObject *abt, PyObject *target, int target_requires_grad,
                    int translate_storage_offset)
{
    PyObject *argv[4] = {NULL, NULL, NULL, NULL};
    PyObject *src = NULL, *out = NULL;
    if ((argv[1] = rt_tensor_call(st, RT_SIZE, target, NULL, 0)) == NULL ||
        (argv[2] = rt_tensor_call(st, RT_STRIDE, target, NULL, 0)) == NULL ||
        (argv[3] = rt_tensor_call(st, RT_STORAGE_OFFSET, target, NULL, 0)) == NULL) {
        goto done;
    }
    if (translate_storage_offset) {
        int other = other_storage(st, abt, target);
        if (other < 0) {
            goto done;
        }
        if (other) {
            PyObject *base_offset = rt_tensor_call(st, RT_STORAGE_OFFSET, abt, NULL, 0);
            if (base_offset == NULL) {
                goto done;
            }
            Py_SETREF(argv[3], PyNumber_Add(base_offset, argv[3]));
            Py_DECREF(base_offset);
            if (argv[3] == NULL) {
                goto done;
            }
        }
    }
    /* if abt.is_complex() and not target.is_complex(): view_as_real
     * elif not abt.is_complex() and target.is_complex(): view_as_complex
     * (abt.is_complex() is called again by the elif, as upstream's) */
    int c = is_complex(st, abt);
    if (c < 0) {
        goto done;
    }
    if (c) {
        int tc = is_complex(st, target);
        if (tc < 0) {
            goto done;
        }
        if (!tc) {
            src = PyObject_CallOneArg(st->aot.alias.view_as_real, abt);
            if (src == NULL) {
                goto done;
            }
        }
    }
    if (src == NULL) {
        c = is_complex(st, abt);
        if (c < 0) {
            goto done;
        }
        if (!c) {
            int tc = is_complex(st, target);
            if (tc < 0) {
                goto done;
            }
            if (tc && (src = PyObject_CallOneArg(st->aot.alias.view_as_complex, abt)) == NULL) {
                goto done;
            }
        }
    }
    argv[0] = src != NULL ? src : abt;
    out = PyObject_VectorcallMethod(st->aot.alias.str_as_strided, argv,
                                    4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (out == NULL) {
        goto done;
    }
    out = rt_patch_requires_grad(st, abt, out, target_requires_grad);
    if (out == NULL) {
        goto done;
    }
    /* if aliased_out.dtype != target.dtype: aliased_out.view(target.dtype) */
    {
        int differs = attrs_compare(out, target, st->aot.obj.str_dtype, Py_NE);
        if (differs < 0) {
            Py_CLEAR(out);
        }
        else if (differs) {
            PyObject *dtype = PyObject_GetAttr(target, st->aot.obj.str_dtype);
            if (dtype == NULL) {
                Py_CLEAR(out);
            }
            else {
                Py_SETREF(out, PyObject_CallMethodOneArg(out, st->aot.alias.str_view, dtype));
                Py_DECREF(dtype);
            }
        }
    }
done:
    Py_XDECREF(src);
    Py_XDECREF(argv[1]);
    Py_XDECREF(argv[2]);
    Py_XDECREF(argv[3]);
    return out;
}

PyObject *
rt_alias_from_base(rt_state *st, PyObject *base, PyObject *target, int target_requires_grad,
                   int translate_storage_offset)
{
    /* if target._base is not None: b = target._base (read twice, as
     * upstream does; a TorchFunctionMode sees both) */
    PyObject *b = PyObject_GetAttr(target, st->aot.alias.str_base);
    if (b == NULL) {
        return NULL;
    }
    if (b != Py_None) {
        Py_SETREF(b, PyObject_GetAttr(target, st->aot.alias.str_base));
        if (b == NULL) {
            return NULL;
        }
        PyObject *out = alias_by_view_func(st, base, target, b, target_requires_grad);
        Py_DECREF(b);
        if (out != NULL || PyErr_Occurred()) {
            return out;
        }
    }
    else {
        Py_DECREF(b);
    }
    return alias_by_as_strided(st, base, target, target_requires_grad, translate_storage_offset);
}
