/* dict_version.h: "has this dict changed since?" for the per-call checks
 * that a module's globals are still the objects bound; and its twin for
 * classes, "is this type still at the version tag it was checked at?".
 *
 * CPython 3.11 gives every dict a version (PEP 509, ma_version_tag) that
 * takes a new, never reused value whenever the dict is changed, so a check
 * of a dict's entries that passed at one version passes at that version
 * again. 3.12 deprecates the field (dict watchers replace it); there
 * rt_dict_version answers 0, "unknown", and the checks run every time.
 */
#ifndef TORCH_AOT_RT_DICT_VERSION_H
#define TORCH_AOT_RT_DICT_VERSION_H

#include <Python.h>
#include <stdint.h>

/* d's version, or 0 when the interpreter has none to offer: a cached
 * version of 0 never matches. d is an exact dict. */
static inline uint64_t
rt_dict_version(PyObject *d)
{
#if PY_VERSION_HEX < 0x030C0000
    return ((PyDictObject *)d)->ma_version_tag;
#else
    (void)d;
    return 0;
#endif
}

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
    return (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag == verified;
}

#endif
