/* subclass_program.h: the program SubclassWrapper runs (subclass_wrapper.c):
 * small instructions over registers, parsed and validated once
 * (subclass_program.c). Private to aot/. */
#ifndef TORCH_AOT_RT_SUBCLASS_PROGRAM_H
#define TORCH_AOT_RT_SUBCLASS_PROGRAM_H

#include "fn_object.h"

/* The instructions (torch_aot_rt/_kinds.py SC_*). "append" is to the flat
 * argument list of the graph (`unwrapped_args`); "outs" is what the graph
 * returned (`unwrapped_outs`). */
enum sc_op {
    SC_ARG = 0,         /* append args[a] */
    SC_NONE = 1,        /* append None (an input inductor froze) */
    SC_LOAD_CHECKED = 2,/* r[a] = args[b]; assert type(r[a]) is obj */
    SC_GETATTR = 3,     /* r[a] = getattr(r[b], obj) */
    SC_APPEND_ATTR = 4, /* append getattr(r[b], obj) */
    SC_APPEND = 5,      /* append r[a] */
    SC_SIZE = 6,        /* s = (getattr(r[a], obj) if obj else r[a]).size(); append s[i] for i in idx */
    SC_STRIDE = 7,      /* the same with stride() */
    SC_OUT = 8,         /* r[a] = outs[b], or outs[cursor++] when b is -1 */
    SC_OPT_SKIP = 9,    /* 2.14's optional SymInt output: later counts a (min), b (max) */
    SC_DICT = 10,       /* r[a] = {obj[k]: r[idx[k]]} */
    SC_TUPLE = 11,      /* r[a] = obj with each item k where idx[k] >= 0 replaced by r[idx[k]]
                         * (obj itself when no item is: a folded constant) */
    SC_UNFLATTEN = 12,  /* r[a] = obj.__tensor_unflatten__(r[b], obj2, size, stride): size is
                         * r[c], or r[c].size() when idx[0]; stride r[d] or r[d].stride() when idx[1] */
    SC_N_OPS
};

typedef struct {
    int op;
    Py_ssize_t a, b, c, d;
    PyObject *obj;      /* owned, or NULL */
    PyObject *obj2;     /* owned, or NULL */
    Py_ssize_t n;       /* idx */
    Py_ssize_t *idx;
} sc_instr;

typedef struct {
    sc_instr *code;
    Py_ssize_t n;
} sc_program;

/* how the activations saved for backward are returned after the outputs */
enum sc_tail { SC_TAIL_NONE = 0, SC_TAIL_FROM = 1, SC_TAIL_FROM_END = 2 };

/* The program of `tuple` (what: its name in errors), validated against the
 * registers (written: which are written so far, updated), into p: 0, or -1
 * with a ValueError naming the instruction. */
int rt_sc_program_parse(PyObject *tuple, const char *what, bool unwrap, Py_ssize_t n_regs,
                        Py_ssize_t n_inputs, char *written, Py_ssize_t *appends,
                        sc_program *p);
void rt_sc_program_free(sc_program *p);
int rt_sc_program_traverse(sc_program *p, visitproc visit, void *arg);
/* a non-negative int (0, or -1 with an exception); a register index in
 * range, and for a read one already written (1/0) */
int rt_sc_ssize(PyObject *v, Py_ssize_t *out);
int rt_sc_reg(Py_ssize_t reg, Py_ssize_t n_regs, const char *written, bool read);

#endif
