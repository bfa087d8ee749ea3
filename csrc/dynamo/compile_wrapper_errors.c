/* compile_wrapper_errors.c: compile_wrapper's except clauses around fn's call
 * (the compiler errors it re-raises, ShortenTraceback) and its fullgraph and
 * error_on_graph_break handling, including fullgraph's no-compiled-frames
 * error (see compile_wrapper.c). */
#include "dynamo/compile_wrapper_call.h"

#include <string.h>

/* The except clauses around fn's call, on the pending exception: the exit
 * its traceback entry is at (enum rt_cw_frame), or -1 where handling it
 * raised another. The entry of the call itself is added first, as
 * upstream's frame has it when its except clauses run. */
int
rt_cw_transform_exception(rt_cw_state *cw, const rt_frame_call *call)
{
    rt_frame_add(cw->frames[RT_CW_FRAME_CALL], call);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    int compiler_error = PyObject_IsInstance(value, cw->exc_compiler_error);
    int shorten = compiler_error == 0 ? PyObject_IsInstance(value, cw->exc_shorten) : 0;
    if (compiler_error < 0 || shorten < 0) {
        goto raised; /* the isinstance error, with the exception as context */
    }
    if (compiler_error) {
        PyObject *config = cw->expected[RT_CWG_CONFIG];
        int verbose = rt_cw_attr_truthy(config, cw->str_verbose);
        if (verbose != 0) {
            if (verbose < 0) {
                goto raised;
            }
            PyErr_Restore(type, value, tb); /* bare `raise` */
            return RT_CW_FRAME_CALL;
        }
        /* strip internal tracebacks from causes */
        PyObject *cur = Py_NewRef(value);
        for (;;) {
            PyObject *cause = PyException_GetCause(cur);
            if (cause == NULL) {
                break;
            }
            PyObject *r = PyObject_CallMethodOneArg(cause, cw->str_with_traceback, Py_None);
            Py_XDECREF(r);
            Py_SETREF(cur, cause);
            if (r == NULL) {
                Py_DECREF(cur);
                goto raised;
            }
        }
        Py_DECREF(cur);
        /* raise e.with_traceback(None) from e.__cause__ (raising the
         * exception being handled sets no context) */
        PyObject *same = PyObject_CallMethodOneArg(value, cw->str_with_traceback, Py_None);
        if (same == NULL) {
            goto raised;
        }
        PyObject *cause = PyException_GetCause(same);
        PyException_SetCause(same, cause); /* steals; sets __suppress_context__ */
        Py_DECREF(type);
        Py_DECREF(value);
        Py_XDECREF(tb);
        /* restored as it is: PyErr_SetObject would make the caller's
         * handled exception its context */
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(same)), same, PyException_GetTraceback(same));
        return RT_CW_FRAME_COMPILER_ERROR;
    }
    if (shorten) {
        /* raise e.remove_dynamo_frames() from None */
        PyObject *e2 = PyObject_CallMethodNoArgs(value, cw->str_remove_dynamo_frames);
        if (e2 == NULL) {
            goto raised;
        }
        if (!PyExceptionInstance_Check(e2)) {
            Py_DECREF(e2);
            PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
            goto raised;
        }
        PyException_SetCause(e2, NULL);
        if (e2 != value) {
            PyException_SetContext(e2, Py_NewRef(value));
        }
        Py_DECREF(type);
        Py_DECREF(value);
        Py_XDECREF(tb);
        /* raising an exception keeps its __traceback__ and goes on from it */
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(e2)), e2, PyException_GetTraceback(e2));
        return RT_CW_FRAME_SHORTEN;
    }
    PyErr_Restore(type, value, tb);
    return RT_CW_FRAME_CALL;
raised:
    {
        /* an error while handling: it wins, the exception as its context */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 != value) {
            PyException_SetContext(v2, value); /* steals */
        }
        else {
            Py_DECREF(value);
        }
        Py_DECREF(type);
        Py_XDECREF(tb);
        PyErr_Restore(t2, v2, tb2);
    }
    return -1;
}

/* The fullgraph check in the inner finally: no compiled frame ran. */
static int
no_compiled_frames_error(rt_cw_state *cw)
{
    PyObject *tls = cw->expected[RT_CWG_DYNAMO_TLS];
    PyObject *reasons = PyObject_GetAttr(tls, cw->str_skip_reasons);
    if (reasons == NULL) {
        return -1;
    }
    /* get_skip_reasons(): dynamo_tls.skip_reasons or [] */
    int any = PyObject_IsTrue(reasons);
    PyObject *msg = NULL;
    if (any > 0) {
        PyObject *lines = PyList_New(0);
        PyObject *it = lines ? PyObject_GetIter(reasons) : NULL;
        PyObject *r;
        while (it != NULL && (r = PyIter_Next(it)) != NULL) {
            PyObject *line = PyUnicode_FromFormat("  - %S", r);
            Py_DECREF(r);
            if (line == NULL || PyList_Append(lines, line) < 0) {
                Py_XDECREF(line);
                Py_CLEAR(it);
                break;
            }
            Py_DECREF(line);
        }
        if (it != NULL && !PyErr_Occurred()) {
            PyObject *sep = PyUnicode_FromString("\n");
            PyObject *joined = sep ? PyUnicode_Join(sep, lines) : NULL;
            if (joined != NULL) {
                msg = PyUnicode_FromFormat(
                    "torch.compile with fullgraph=True found no compiled frames. "
                    "Skipped frames:\n%U", joined);
            }
            Py_XDECREF(joined);
            Py_XDECREF(sep);
        }
        Py_XDECREF(it);
        Py_XDECREF(lines);
    }
    else if (any == 0) {
        msg = PyUnicode_FromString(
            "torch.compile with fullgraph=True found no compiled frames. Compilation was "
            "not attempted and no cached compiled code was found.");
    }
    Py_DECREF(reasons);
    if (msg != NULL) {
        PyErr_SetObject(PyExc_RuntimeError, msg);
        Py_DECREF(msg);
    }
    return -1;
}

/* if not self.fullgraph and self.error_on_graph_break is not None: the
 * setting set for the call where it differs (2.12: whatever it is), *prior
 * the value to restore after (NULL: none; a current None is not restored).
 * 0, or -1 with an exception. */
int
rt_cw_enter_error_on_graph_break(rt_cw_state *cw, PyObject *eog, PyObject **prior)
{
    PyObject *get_eog = PyDict_GetItemWithError(cw->globals, cw->str_get_eog);
    PyObject *set_eog = get_eog ? PyDict_GetItemWithError(cw->globals, cw->str_set_eog) : NULL;
    if (set_eog == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_get_error_on_graph_break' is not defined");
        }
        return -1;
    }
    PyObject *current = PyObject_CallNoArgs(get_eog);
    if (current == NULL) {
        return -1;
    }
    int differs = cw->eog_where_differs ? PyObject_RichCompareBool(current, eog, Py_NE) : 1;
    if (differs > 0 && do1(set_eog, eog) == 0) {
        /* restored after unless None (`if prior_error_on_graph_break is not
         * None`) */
        if (current != Py_None) {
            *prior = current;
            return 0;
        }
        Py_DECREF(current);
        return 0;
    }
    Py_DECREF(current);
    return differs != 0 ? -1 : 0;
}

/* The fullgraph check of the inner finally: set_fullgraph_compiled_frame_
 * count(-1) returned n; no compiled frame ran where it is 0. 0, or -1 with
 * an exception (the RuntimeError, 2.12's warning as an error). */
int
rt_cw_fullgraph_exit_check(rt_cw_state *cw, PyObject *count)
{
    long n = PyLong_AsLong(count);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n != 0) {
        return 0;
    }
    if (cw->fullgraph == RT_CW_FG_WARN) {
        /* 2.12: torch._dynamo.utils.warn_once(...), whatever the stance */
        return do0(cw->fullgraph_warn);
    }
    /* `if count == 0 and _stance.stance == "default"` */
    PyObject *st_obj = PyDict_GetItemWithError(cw->globals, cw->str_stance_global);
    int is_default = st_obj != NULL ? rt_cw_stance_is_default(cw, st_obj) : -1;
    if (is_default < 0 || (is_default && no_compiled_frames_error(cw) < 0)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_stance' is not defined");
        }
        return -1;
    }
    return 0;
}
