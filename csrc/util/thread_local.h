/* thread_local.h: attributes of a threading.local read and set through the
 * current thread's dict of it, remembered per thread.
 *
 * Dynamo and inductor keep per-thread state in threading.local objects
 * (torch._guards._TLS, eval_frame's dynamo_tls and
 * _force_eager_nested_compile, utils' _metrics_context_tls, the FX tracing
 * flag's), read on every compiled call. CPython's local_getattro finds the
 * thread's dict of the local (a look-up in the thread state's dict), compares
 * the name with "__dict__", then does the generic look-up with that dict
 * (_PyObject_GenericGetAttrWithDict): about 450 instructions a read, 620 a
 * write. Here the dict is fetched once, as `local.__dict__` (which makes it,
 * running a subclass's __init__, where the thread has none yet, as any read
 * does), and kept with the id of the thread it belongs to
 * (PyThreadState_GetID: never reused in an interpreter); a read or write
 * from another thread fetches that thread's. Each read or write then does
 * the generic look-up's steps with that dict: a data descriptor of the
 * class is Python's own look-up; else the dict's entry; else a class
 * attribute (a non-descriptor; a descriptor is Python's). Objects whose
 * class is not _thread._local or a subclass keeping its getattro/setattro
 * are read and set with PyObject_GetAttr / PyObject_SetAttr.
 *
 * Each local remembers the dicts of up to RT_TLS_THREADS threads, so that
 * a server's threads calling the same compiled functions in turn each find
 * theirs. A remembered dict is a strong reference: after its thread ends it
 * lives until a read from a thread not remembered needs its place (the
 * entries of ended threads go first) or the module's clear, where
 * upstream's would be freed with the thread. */
#ifndef TORCH_AOT_RT_THREAD_LOCAL_H
#define TORCH_AOT_RT_THREAD_LOCAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The threading.local objects read per call, one remembered dict each. */
enum {
    RT_TLS_GUARDS,        /* torch._guards._TLS: tracing_context */
    RT_TLS_FX_FLAG,       /* 2.14 on: _is_fx_tracing_tls.flag */
    RT_TLS_EAGER_NESTED,  /* 2.14 on: _force_eager_nested_compile.depth */
    RT_TLS_DYNAMO,        /* eval_frame.dynamo_tls: skip_reasons */
    RT_TLS_METRICS,       /* utils._metrics_context_tls: runtime_metrics_context */
    RT_TLS_N
};

#define RT_TLS_THREADS 8

typedef struct {
    uint64_t thread_id;   /* 0: empty */
    PyObject *dict;       /* the local's dict for that thread */
} rt_tls_thread;

typedef struct {
    PyObject *local;      /* the threading.local */
    rt_tls_thread threads[RT_TLS_THREADS];
    int next;             /* the entry a new thread takes when none is free */
} rt_tls_slot;

typedef struct {
    PyTypeObject *type;   /* _thread._local */
    PyObject *str_dict;   /* "__dict__" */
    rt_tls_slot slots[RT_TLS_N];
} rt_thread_locals;

int rt_thread_locals_init(rt_thread_locals *t);
int rt_thread_locals_traverse(rt_thread_locals *t, visitproc visit, void *arg);
void rt_thread_locals_clear(rt_thread_locals *t);

/* getattr(local, name): 1 with *out (a new reference), 0 where the
 * attribute is absent (AttributeError, cleared), -1 with an exception. */
int rt_tls_get(rt_thread_locals *t, int slot, PyObject *local, PyObject *name, PyObject **out);

/* setattr(local, name, value): 0, or -1 with an exception. */
int rt_tls_set(rt_thread_locals *t, int slot, PyObject *local, PyObject *name, PyObject *value);

#endif
