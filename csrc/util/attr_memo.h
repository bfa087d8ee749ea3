/* attr_memo.h: plain instance attributes read once and remembered while
 * neither the object's dict nor its class changes.
 *
 * compile_wrapper reads, on every call, attributes of Dynamo's context
 * (fullgraph, export, error_on_graph_break, enter_exit_hooks,
 * _isolate_recompiles_id), which change rarely; PyObject_GetAttr costs
 * about 200 instructions each.
 * Where the object's class looks attributes up generically
 * (PyObject_GenericGetAttr) and none of the names is a descriptor of the
 * class (a plain class attribute, such as a dataclass default, is allowed),
 * a read returns the instance dict's entry, else the class attribute, and
 * runs no code: its result changes only when the instance dict changes (its
 * version, dict_version.h) or a class in the MRO does (the type's version
 * tag). The memo keeps the results with both; the next read at the same
 * versions is those results. Anything else, or an interpreter without dict
 * versions, reads with PyObject_GetAttr every time.
 *
 * The instance dict is taken with PyObject_GenericGetDict: where CPython
 * keeps the attributes inline (3.11's and 3.12's managed dicts), that makes
 * the object use a dict from then on, with the same attributes, and makes
 * Python's own reads of it slower (its attribute-read specializations are
 * for inline values). From 3.13 an object whose values are inline keeps
 * them there, shared with the dict, and a write reaches no dict watcher:
 * such objects are read each time (py_compat.h). So a memo is only for objects no Python reads per call once the
 * C path runs: the context is read per call only by compile_wrapper. The
 * stance and config entries, which upstream's Python reads on every call of
 * a function compiled without us, are read each time (memoized, they cost
 * upstream's calls about 3,200 instructions more in the benchmark).
 */
#ifndef TORCH_AOT_RT_ATTR_MEMO_H
#define TORCH_AOT_RT_ATTR_MEMO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define RT_ATTR_MEMO_MAX 10

typedef struct {
    PyObject *obj;
    PyObject *dict;                     /* obj's instance dict */
    uint64_t dict_version;
    unsigned int type_tag;
    int n;
    PyObject *values[RT_ATTR_MEMO_MAX]; /* NULL: absent (an AttributeError) */
} rt_attr_memo;

/* getattr(obj, names[i]) for i < n (n <= RT_ATTR_MEMO_MAX), always with the
 * same names for one memo: 1 with m->values[i] set (borrowed from the
 * memo: take a reference to keep one past the memo's next read), NULL where
 * the attribute is absent (an AttributeError); 0 where the reads could run
 * code or have no versions to watch: nothing was read, the caller reads
 * with PyObject_GetAttr; -1 with an exception (the memo is then empty). */
int rt_attr_memo_read(rt_attr_memo *m, PyObject *obj, PyObject *const *names, int n);

int rt_attr_memo_traverse(rt_attr_memo *m, visitproc visit, void *arg);
void rt_attr_memo_clear(rt_attr_memo *m);

#endif
