/* py_compat.h: every difference between the CPython versions the C core
 * builds against (3.10 to 3.15), in one place, each named with the version
 * it starts at (in the manner of pythoncapi-compat and numpy's
 * npy_2_compat.h). No other file of csrc/ tests the Python version.
 *
 * The private or unstable parts of CPython the C core uses, and where each
 * stands:
 * - _PyType_Lookup (a type's MRO look-up, borrowed, runs no code):
 *   exported on every version here.
 * - tp_dict: NULL for static builtin types from 3.12 (their dicts live in
 *   the interpreter): rt_type_dict.
 * - dict versions (PEP 509, ma_version_tag): deprecated in 3.12, removed in
 *   3.14; from 3.12 a dict watcher stands in (RT_PY_DICT_WATCHERS,
 *   util/dict_version.h).
 * - tp_version_tag: on every version; its validity flag is only
 *   needed on 3.10 and is not kept in step from 3.13 (rt_type_tag_valid).
 * - PyThreadState_GetID: public from 3.9.
 * - a function's vectorcall: PyFunction_SetVectorcall from 3.12, the field
 *   itself before (rt_function_set_vectorcall). The default one
 *   (_PyFunction_Vectorcall) is private from 3.13: it is read off a
 *   function instead of named.
 * - the raised exception as one object: PyErr_GetRaisedException /
 *   PyErr_SetRaisedException from 3.12, PyErr_Fetch / PyErr_Restore before
 *   (rt_take_exception, rt_raise_as_is).
 * - weak references: PyWeakref_GET_OBJECT and PyWeakref_GetObject are
 *   removed in 3.15 (rt_weakref_is, rt_weakref_get).
 */
#ifndef TORCH_AOT_RT_UTIL_PY_COMPAT_H
#define TORCH_AOT_RT_UTIL_PY_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030A0000
#error "torch_aot_rt's C core needs CPython 3.10 or newer"
#endif

/* 3.12: dict watchers (PyDict_AddWatcher, PyDict_Watch); the dict version
 * tag is deprecated (and removed in 3.14). */
#define RT_PY_DICT_WATCHERS (PY_VERSION_HEX >= 0x030C0000)

/* tp's __dict__, borrowed (the type keeps it as long as it lives).
 * 3.12: a static builtin type's tp_dict is NULL, its dict is the
 * interpreter's, reached through PyType_GetDict (a new reference). */
static inline PyObject *
rt_type_dict(PyTypeObject *tp)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *d = PyType_GetDict(tp);
    Py_XDECREF(d); /* borrowed: tp (or the interpreter) holds it */
    return d;
#else
    return tp->tp_dict;
#endif
}

/* tp has a valid version tag (tp_version_tag changes whenever tp or a class
 * of its MRO changes). 3.11: a change sets the tag to 0, never a valid one,
 * and from 3.13 the interpreter no longer keeps Py_TPFLAGS_VALID_VERSION_TAG
 * in step with the tag (seen: a valid tag without the flag), so the tag
 * alone says it; 3.10 clears only the flag, which must then be set too. */
static inline int
rt_type_tag_valid(PyTypeObject *tp)
{
#if PY_VERSION_HEX >= 0x030B0000
    return tp->tp_version_tag != 0;
#else
    return (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag != 0;
#endif
}

/* A write of an attribute of an instance of tp changes its instance dict
 * (taken with PyObject_GenericGetDict), so that the dict's version tells
 * it. 3.13: instances whose values live inline keep them there after their
 * dict is taken (the dict shares them), and a write reaches no dict
 * watcher; before, taking the dict moves the values into it. */
static inline int
rt_instance_writes_reach_dict(PyTypeObject *tp)
{
#ifdef Py_TPFLAGS_INLINE_VALUES
    return !(tp->tp_flags & Py_TPFLAGS_INLINE_VALUES);
#else
    (void)tp;
    return 1;
#endif
}

/* Makes calls of the function fn run `call` (which must do what the
 * function does). 3.12: PyFunction_SetVectorcall, which also keeps the
 * interpreter's call specializations from inlining fn's frame; before,
 * the field (3.10/3.11 inline a function's frame only where its vectorcall
 * is the default one). */
static inline void
rt_function_set_vectorcall(PyObject *fn, vectorcallfunc call)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyFunction_SetVectorcall((PyFunctionObject *)fn, call);
#else
    ((PyFunctionObject *)fn)->vectorcall = call;
#endif
}

/* fn's vectorcall (the default one, on a function fresh from Python) */
static inline vectorcallfunc
rt_function_vectorcall(PyObject *fn)
{
    return ((PyFunctionObject *)fn)->vectorcall;
}

/* A Python function called with *args from a Python caller's *args (as
 * BackwardCFunction.apply calls a Function's backward): up to 3.11 the
 * caller's argument tuple stays alive through the callee's body beside the
 * callee's own *args tuple, two references to each argument; from 3.12 the
 * call releases the former before the body runs, one. A C callee that
 * stands in for such a Python one holds as many (sys.getrefcount inside,
 * and what a compiled backward may reuse in place, are the same). */
#define RT_PY_VARARGS_CALL_KEEPS_CALLER_TUPLE (PY_VERSION_HEX < 0x030C0000)

/* The module's stance, as module slots: one interpreter only (3.12 on: it
 * keeps process-wide state, the dict watcher's table), and the GIL needed
 * (3.13 on; the package never loads it into a free-threaded build). */
#if PY_VERSION_HEX >= 0x030D0000
#define RT_PY_MODULE_STANCE_SLOTS                                                  \
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},   \
    {Py_mod_gil, Py_MOD_GIL_USED},
#elif PY_VERSION_HEX >= 0x030C0000
#define RT_PY_MODULE_STANCE_SLOTS                                                  \
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#else
#define RT_PY_MODULE_STANCE_SLOTS
#endif

/* The raised exception, taken (a new reference, normalized, its
 * __traceback__ set), or NULL with none. 3.12: PyErr_GetRaisedException;
 * before, PyErr_Fetch and PyErr_NormalizeException. */
static inline PyObject *
rt_take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL) {
        return NULL;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
        Py_DECREF(tb);
    }
    Py_DECREF(type);
    return value;
#endif
}

/* Raises exc (stolen) as it is: its __traceback__ goes on, no context is
 * set (PyErr_SetObject would chain the exception being handled).
 * 3.12: PyErr_SetRaisedException; before, PyErr_Restore. */
static inline void
rt_raise_as_is(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

/* 3.11 runs a Python function's frame in the caller's interpreter loop
 * without its vectorcall (the field is honoured from 3.12, and by 3.10's
 * loop): a function whose calls C runs gets code that calls C instead. */
#define RT_PY_INLINES_FUNCTION_CALLS (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)

/* wr's referent is obj, a live object (under the GIL: the field is the
 * referent, or None once it is dead). 3.15 removes PyWeakref_GET_OBJECT;
 * the field, read for identity only, is there on every version. */
static inline int
rt_weakref_is(PyObject *wr, PyObject *obj)
{
    return ((PyWeakReference *)wr)->wr_object == obj;
}

/* wr's referent, a new reference, or NULL where it is dead (no exception).
 * 3.13: PyWeakref_GetRef; before, PyWeakref_GetObject (removed in 3.15). */
static inline PyObject *
rt_weakref_get(PyObject *wr)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj;
    if (PyWeakref_GetRef(wr, &obj) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(wr);
    return obj == NULL || obj == Py_None ? (PyErr_Clear(), NULL) : Py_NewRef(obj);
#endif
}

#endif
