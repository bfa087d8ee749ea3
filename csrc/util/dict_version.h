/* dict_version.h: "has this dict changed since?" for the per-call checks
 * that a module's globals are still the objects bound (and that a memo of
 * an object's attributes still holds); and its twin for classes, "is this
 * type still at the version tag it was checked at?".
 *
 * A version is a number that changes whenever the dict does and is never
 * taken again, so a check that passed at one version passes at it again.
 * Where it comes from is a CPython difference (py_compat.h):
 * - up to 3.11, the dict's own ma_version_tag (PEP 509);
 * - from 3.12 (which deprecates that field; 3.14 removes it), a dict watcher
 *   of ours (PyDict_AddWatcher): the first time a dict's version is asked,
 *   it is watched and given a number; every change the watcher hears of
 *   gives it a new one, and its end forgets it (dict_version.c).
 * 0 means "unknown" (no watcher could be had, or memory ran out): a cached
 * version of 0 never matches, so the checks then run every time.
 */
#ifndef TORCH_AOT_RT_UTIL_DICT_VERSION_H
#define TORCH_AOT_RT_UTIL_DICT_VERSION_H

#include "util/py_compat.h"
#include <stdint.h>

#if RT_PY_DICT_WATCHERS
/* dict_version.c: the watcher's table */
uint64_t rt_watched_dict_version(PyObject *d);
#endif

/* d's version, or 0 when there is none to offer. d is an exact dict. */
static inline uint64_t
rt_dict_version(PyObject *d)
{
#if RT_PY_DICT_WATCHERS
    return rt_watched_dict_version(d);
#else
    return ((PyDictObject *)d)->ma_version_tag;
#endif
}

/* Sets up what rt_dict_version needs (the watcher, from 3.12): once per
 * process, at the module's exec; 0, or -1 with an exception. Without a free
 * watcher (CPython has 8 per interpreter) versions are 0: no error. */
int rt_dict_versions_init(void);

/* 1 when d is at the version *verified (its checks passed there) */
static inline int
rt_dict_unchanged(PyObject *d, uint64_t verified)
{
    uint64_t v = rt_dict_version(d);
    return v != 0 && v == verified;
}

/* 1 when tp is at the version tag *verified (a class checked then): the
 * tag changes whenever tp or a class in its MRO is modified */
static inline int
rt_type_unchanged(PyTypeObject *tp, unsigned int verified)
{
    return rt_type_tag_valid(tp) && tp->tp_version_tag == verified;
}

#endif
