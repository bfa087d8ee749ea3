/* subclass_program.c: SubclassWrapper's program (see subclass_wrapper.c):
 * its instructions' constants for the shim, and the program parsed from the
 * shim's tuples and validated once, at build. */
#include "aot/wrappers/subclass_program.h"

#include <string.h>

int
rt_subclass_constants_add(PyObject *module)
{
    /* what the program is written with (torch_aot_rt/_kinds.py reads them) */
    static const struct {
        const char *name;
        int value;
    } constants[] = {
        {"SC_ARG", SC_ARG}, {"SC_NONE", SC_NONE}, {"SC_LOAD_CHECKED", SC_LOAD_CHECKED},
        {"SC_GETATTR", SC_GETATTR}, {"SC_APPEND_ATTR", SC_APPEND_ATTR},
        {"SC_APPEND", SC_APPEND}, {"SC_SIZE", SC_SIZE}, {"SC_STRIDE", SC_STRIDE},
        {"SC_OUT", SC_OUT}, {"SC_OPT_SKIP", SC_OPT_SKIP}, {"SC_DICT", SC_DICT},
        {"SC_TUPLE", SC_TUPLE}, {"SC_UNFLATTEN", SC_UNFLATTEN},
        {"SC_TAIL_NONE", SC_TAIL_NONE}, {"SC_TAIL_FROM", SC_TAIL_FROM},
        {"SC_TAIL_FROM_END", SC_TAIL_FROM_END},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++) {
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0) {
            return -1;
        }
    }
    return 0;
}
/* ---- construction: the program, validated once ------------------------ */

void
rt_sc_program_free(sc_program *p)
{
    if (p->code == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < p->n; i++) {
        Py_CLEAR(p->code[i].obj);
        Py_CLEAR(p->code[i].obj2);
        PyMem_Free(p->code[i].idx);
        p->code[i].idx = NULL;
    }
    PyMem_Free(p->code);
    p->code = NULL;
    p->n = 0;
}

static int
sc_bad(const char *what, Py_ssize_t pc, const char *why)
{
    PyErr_Format(PyExc_ValueError, "SubclassWrapper plan: %s[%zd]: %s", what, pc, why);
    return -1;
}

int
rt_sc_ssize(PyObject *v, Py_ssize_t *out)
{
    if (!PyLong_Check(v)) {
        return -1;
    }
    *out = PyLong_AsSsize_t(v);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* A register must be in range and (when read) written by an earlier
 * instruction: the call never reads an empty register. */
int
rt_sc_reg(Py_ssize_t reg, Py_ssize_t n_regs, const char *written, bool read)
{
    return reg >= 0 && reg < n_regs && (!read || written[reg]);
}

/* Parses (op, a, b, c, d, obj, obj2, idx) tuples; `unwrap` says which
 * instructions are allowed. */
int
rt_sc_program_parse(PyObject *tuple, const char *what, bool unwrap, Py_ssize_t n_regs,
                 Py_ssize_t n_inputs, char *written, Py_ssize_t *appends, sc_program *p)
{
    if (!PyTuple_Check(tuple)) {
        PyErr_Format(PyExc_ValueError, "SubclassWrapper plan: %s must be a tuple", what);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    p->code = PyMem_Calloc(n ? (size_t)n : 1, sizeof(sc_instr));
    if (p->code == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    p->n = n;
    for (Py_ssize_t pc = 0; pc < n; pc++) {
        PyObject *t = PyTuple_GET_ITEM(tuple, pc);
        sc_instr *in = &p->code[pc];
        Py_ssize_t op;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 8 || rt_sc_ssize(PyTuple_GET_ITEM(t, 0), &op) < 0 ||
            rt_sc_ssize(PyTuple_GET_ITEM(t, 1), &in->a) < 0 || rt_sc_ssize(PyTuple_GET_ITEM(t, 2), &in->b) < 0 ||
            rt_sc_ssize(PyTuple_GET_ITEM(t, 3), &in->c) < 0 || rt_sc_ssize(PyTuple_GET_ITEM(t, 4), &in->d) < 0 ||
            !PyTuple_Check(PyTuple_GET_ITEM(t, 7))) {
            return sc_bad(what, pc, "not an (op, a, b, c, d, obj, obj2, idx) tuple of ints");
        }
        if (op < 0 || op >= SC_N_OPS) {
            return sc_bad(what, pc, "unknown op");
        }
        in->op = (int)op;
        PyObject *obj = PyTuple_GET_ITEM(t, 5), *obj2 = PyTuple_GET_ITEM(t, 6);
        in->obj = obj == Py_None ? NULL : Py_NewRef(obj);
        in->obj2 = Py_NewRef(obj2);  /* __tensor_unflatten__'s meta may be None */
        PyObject *idx = PyTuple_GET_ITEM(t, 7);
        in->n = PyTuple_GET_SIZE(idx);
        in->idx = PyMem_Calloc(in->n ? (size_t)in->n : 1, sizeof(Py_ssize_t));
        if (in->idx == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t j = 0; j < in->n; j++) {
            if (rt_sc_ssize(PyTuple_GET_ITEM(idx, j), &in->idx[j]) < 0) {
                return sc_bad(what, pc, "idx must be ints");
            }
        }
        bool is_unwrap_op = in->op <= SC_STRIDE;
        if (is_unwrap_op != unwrap) {
            return sc_bad(what, pc, unwrap ? "not an unwrap instruction" : "not a wrap instruction");
        }
        bool ok = true;
        switch (in->op) {
        case SC_ARG:
            ok = in->a >= 0 && in->a < n_inputs;
            ++*appends;
            break;
        case SC_NONE:
            ++*appends;
            break;
        case SC_LOAD_CHECKED:
            ok = rt_sc_reg(in->a, n_regs, written, false) && in->b >= 0 && in->b < n_inputs &&
                 in->obj != NULL && PyType_Check(in->obj);
            if (ok) written[in->a] = 1;
            break;
        case SC_GETATTR:
            ok = rt_sc_reg(in->a, n_regs, written, false) && rt_sc_reg(in->b, n_regs, written, true) &&
                 in->obj != NULL && PyUnicode_Check(in->obj);
            if (ok) written[in->a] = 1;
            break;
        case SC_APPEND_ATTR:
            ok = rt_sc_reg(in->b, n_regs, written, true) && in->obj != NULL && PyUnicode_Check(in->obj);
            ++*appends;
            break;
        case SC_APPEND:
            ok = rt_sc_reg(in->a, n_regs, written, true);
            ++*appends;
            break;
        case SC_SIZE:
        case SC_STRIDE:
            ok = rt_sc_reg(in->a, n_regs, written, true) && (in->obj == NULL || PyUnicode_Check(in->obj));
            for (Py_ssize_t j = 0; ok && j < in->n; j++) {
                ok = in->idx[j] >= 0;
            }
            *appends += in->n;
            break;
        case SC_OUT:
            ok = rt_sc_reg(in->a, n_regs, written, false) && in->b >= -1;
            if (ok) written[in->a] = 1;
            break;
        case SC_OPT_SKIP:
            ok = in->a >= 0 && in->b >= 0;
            break;
        case SC_DICT:
            ok = rt_sc_reg(in->a, n_regs, written, false) && in->obj != NULL && PyTuple_Check(in->obj) &&
                 PyTuple_GET_SIZE(in->obj) == in->n;
            for (Py_ssize_t j = 0; ok && j < in->n; j++) {
                ok = rt_sc_reg(in->idx[j], n_regs, written, true);
            }
            if (ok) written[in->a] = 1;
            break;
        case SC_TUPLE:
            ok = rt_sc_reg(in->a, n_regs, written, false) && in->obj != NULL && PyTuple_CheckExact(in->obj) &&
                 PyTuple_GET_SIZE(in->obj) == in->n;
            in->c = 1;  /* constant: no item from a register (computed, not read) */
            for (Py_ssize_t j = 0; ok && j < in->n; j++) {
                ok = in->idx[j] == -1 || rt_sc_reg(in->idx[j], n_regs, written, true);
                if (in->idx[j] != -1) {
                    in->c = 0;
                }
            }
            if (ok) written[in->a] = 1;
            break;
        case SC_UNFLATTEN:
            ok = rt_sc_reg(in->a, n_regs, written, false) && rt_sc_reg(in->b, n_regs, written, true) &&
                 rt_sc_reg(in->c, n_regs, written, true) && rt_sc_reg(in->d, n_regs, written, true) &&
                 in->obj != NULL && in->n == 2;
            if (ok) written[in->a] = 1;
            break;
        }
        if (!ok) {
            return sc_bad(what, pc, "operands out of range, or a register read before it is written");
        }
    }
    return 0;
}

int
rt_sc_program_traverse(sc_program *p, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; p->code != NULL && i < p->n; i++) {
        Py_VISIT(p->code[i].obj);
        Py_VISIT(p->code[i].obj2);
    }
    return 0;
}
