/* config_patch.c: ConfigModule._make_closure_patcher's change and revert
 * (torch/utils/_config_module.py), which compile_wrapper's enter hooks run
 * on every call of a function compiled with dynamic= or dynamic_shapes=.
 * 2.13 on:
 *
 *     def change():
 *         prior = {k: config[k].user_override.get() for k in changes}
 *         for k, v in changes.items():
 *             config[k].user_override.set(v)
 *             self._hash_dirty_var.set(True)
 *             self._mark_get_dict_dirty(k)
 *         def revert():
 *             for k, v in prior.items():
 *                 (the same three steps, with v from prior)
 *         return revert
 *
 *     def _mark_get_dict_dirty(self, name):
 *         dirty = self._get_dict_dirty_keys_var.get()
 *         if dirty is None:
 *             return
 *         dirty.add(name)
 *         if len(dirty) > self._GET_DICT_DIRTY_KEYS_CAP:
 *             self._get_dict_dirty_keys_var.set(None)
 *
 * 2.12's change and revert set self._config[k].user_override (self._config
 * read for each key), nothing marked dirty; 2.11's assign it, a plain
 * attribute (self._config[k].user_override = v; prior reads
 * config[k].user_override).
 *
 * Every step here is the object-protocol call the bytecode makes (item,
 * attribute, method call, len, comparison), so it is exact for any object
 * it meets; only the frames are gone. The method is mirrored where
 * self's lookup of _mark_get_dict_dirty finds ConfigModule's function
 * (module_getattro, the class attribute, nothing in the module's __dict__),
 * and called otherwise.
 *
 * Three exact shortcuts keep the steps' cost down (a dynamic= call runs
 * four of them): a ContextVar's get and set through the C API (the type
 * is final: its methods are those); a set's add likewise; and an
 * attribute of the config module read as its class reads it: the class
 * defines __getattr__, so CPython's slot calls module.__getattribute__
 * through its wrapper (a bound method made and called, about 550
 * instructions) and __getattr__ on an AttributeError; module_attr calls
 * module_getattro directly, then the class's __getattr__ the same way. */
#include "config/config_patch.h"

#include "state.h"

/* obj.name(arg) dropped: 0 / -1 */
static int
call_method1(PyObject *obj, PyObject *name, PyObject *arg)
{
    PyObject *r = PyObject_CallMethodOneArg(obj, name, arg);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

/* var.set(v), its token dropped: 0 / -1 */
static int
var_set(rt_config_reader *r, PyObject *var, PyObject *v)
{
    if (!PyContextVar_CheckExact(var)) {
        return call_method1(var, r->str_set, v);
    }
    PyObject *token = PyContextVar_Set(var, v);
    Py_XDECREF(token);
    return token != NULL ? 0 : -1;
}

/* var.get(): a new reference, or NULL with an exception (LookupError where
 * it has no value and no default, as ContextVar.get raises) */
static PyObject *
var_get(rt_config_reader *r, PyObject *var)
{
    if (!PyContextVar_CheckExact(var)) {
        return PyObject_CallMethodNoArgs(var, r->str_get);
    }
    PyObject *v;
    if (PyContextVar_Get(var, NULL, &v) < 0) {
        return NULL;
    }
    if (v == NULL) {
        PyErr_SetObject(PyExc_LookupError, var);
    }
    return v;
}

/* tp's attribute lookup is ModuleType's: module_getattro itself, or the
 * __getattr__ hook (ConfigModule defines one) over ModuleType's
 * __getattribute__, which only runs __getattr__ for a name not found */
static int
module_lookup(rt_config_reader *r, PyTypeObject *tp)
{
    return tp->tp_getattro == PyModule_Type.tp_getattro ||
           _PyType_Lookup(tp, r->str_getattribute) == r->module_getattribute;
}

/* self.name, self the config module (see the top of the file) */
static PyObject *
module_attr(rt_config_reader *r, PyObject *self, PyObject *name)
{
    PyTypeObject *tp = Py_TYPE(self);
    int plain = tp->tp_getattro == PyModule_Type.tp_getattro;
    /* a Python class over module.__getattribute__: module's getattro, or
     * the __getattr__ hook around it */
    if (!PyModule_Check(self) || !(plain || (tp->tp_flags & Py_TPFLAGS_HEAPTYPE)) ||
        !module_lookup(r, tp)) {
        return PyObject_GetAttr(self, name);
    }
    PyObject *v = PyModule_Type.tp_getattro(self, name);
    if (v != NULL || plain || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return v;
    }
    /* the hook's fallback: type(self).__getattr__, bound, called with name */
    PyObject *getattr = _PyType_Lookup(tp, r->method_names[RT_CFGM_GETATTR]);
    if (getattr == NULL) {
        return NULL; /* the AttributeError stands */
    }
    PyErr_Clear();
    Py_INCREF(getattr);
    descrgetfunc get = Py_TYPE(getattr)->tp_descr_get;
    if (get == NULL) {
        v = PyObject_CallOneArg(getattr, name);
    }
    else {
        PyObject *bound = get(getattr, self, (PyObject *)tp);
        v = bound != NULL ? PyObject_CallOneArg(bound, name) : NULL;
        Py_XDECREF(bound);
    }
    Py_DECREF(getattr);
    return v;
}

/* self._mark_get_dict_dirty(name) */
static int
mark_dirty(rt_config_reader *r, PyObject *self, PyObject *name)
{
    PyTypeObject *tp = Py_TYPE(self);
    int mirrored = r->mark_dirty != NULL && PyModule_Check(self) && module_lookup(r, tp) &&
                   _PyType_Lookup(tp, r->str_mark_dirty) == r->mark_dirty;
    if (mirrored) {
        PyObject *own = PyDict_GetItemWithError(PyModule_GetDict(self), r->str_mark_dirty);
        if (own != NULL || PyErr_Occurred()) {
            if (PyErr_Occurred()) {
                return -1;
            }
            mirrored = 0;
        }
    }
    if (!mirrored) {
        return call_method1(self, r->str_mark_dirty, name);
    }
    PyObject *var = module_attr(r, self, r->str_dirty_keys_var);
    PyObject *dirty = var ? var_get(r, var) : NULL;
    if (dirty == NULL) {
        Py_XDECREF(var);
        return -1;
    }
    int rc = 0;
    if (dirty != Py_None) {
        rc = PySet_CheckExact(dirty) ? PySet_Add(dirty, name) : call_method1(dirty, r->str_add, name);
        Py_ssize_t n = rc == 0 ? PyObject_Size(dirty) : -1;
        PyObject *len = n >= 0 ? PyLong_FromSsize_t(n) : NULL;
        PyObject *cap = len ? module_attr(r, self, r->str_dirty_cap) : NULL;
        int over = cap ? PyObject_RichCompareBool(len, cap, Py_GT) : -1;
        Py_XDECREF(len);
        Py_XDECREF(cap);
        rc = over < 0 ? -1 : over ? var_set(r, var, Py_None) : 0;
    }
    Py_DECREF(dirty);
    Py_DECREF(var);
    return rc;
}

/* config[k].user_override.set(v); self._hash_dirty_var.set(True);
 * self._mark_get_dict_dirty(k) (2.12: self._config[k].user_override.set(v);
 * 2.11: self._config[k].user_override = v) */
static int
apply_one(rt_state *st, rt_config_patch *p, PyObject *k, PyObject *v)
{
    rt_config_reader *r = &st->config_reader;
    PyObject *self = p->self;
    int marked = p->form == RT_PATCH_VAR_MARKED;
    PyObject *config = marked ? Py_NewRef(p->config) : module_attr(r, self, r->str_config);
    PyObject *entry = config ? PyObject_GetItem(config, k) : NULL;
    Py_XDECREF(config);
    if (entry == NULL) {
        return -1;
    }
    int rc;
    if (p->form == RT_PATCH_ATTRIBUTE) {
        rc = PyObject_SetAttr(entry, r->str_user_override, v);
        Py_DECREF(entry);
        return rc;
    }
    PyObject *var = PyObject_GetAttr(entry, r->str_user_override);
    Py_DECREF(entry);
    rc = var ? var_set(r, var, v) : -1;
    Py_XDECREF(var);
    if (rc < 0 || !marked) {
        return rc;
    }
    PyObject *hash_var = module_attr(r, self, r->str_hash_dirty_var);
    rc = hash_var ? var_set(r, hash_var, Py_True) : -1;
    Py_XDECREF(hash_var);
    return rc < 0 ? -1 : mark_dirty(r, self, k);
}

/* for k, v in pairs.items(): apply_one(...), pairs an exact dict nothing
 * else holds while this runs (changes: the call's own **kwargs; prior: ours) */
static int
apply_all(rt_state *st, rt_config_patch *p, PyObject *pairs)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(pairs, &pos, &k, &v)) {
        Py_INCREF(k);
        Py_INCREF(v);
        int rc = apply_one(st, p, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

int
rt_config_patch_enter(rt_state *st, PyObject *closure, rt_patch_form form, rt_config_patch *p)
{
    rt_config_reader *r = &st->config_reader;
    p->self = p->config = p->prior = NULL;
    p->form = form;
    if (closure == NULL || !PyTuple_Check(closure) || PyTuple_GET_SIZE(closure) != 3) {
        PyErr_SetString(PyExc_SystemError, "a config patcher without its three cells");
        return -1;
    }
    PyObject *changes = PyCell_GET(PyTuple_GET_ITEM(closure, 0));
    PyObject *config = PyCell_GET(PyTuple_GET_ITEM(closure, 1));
    PyObject *self = PyCell_GET(PyTuple_GET_ITEM(closure, 2));
    if (changes == NULL || config == NULL || self == NULL) {
        PyErr_SetString(PyExc_NameError, "free variable referenced before assignment");
        return -1;
    }
    if (!PyDict_CheckExact(changes)) {
        PyErr_SetString(PyExc_TypeError, "the patcher's changes are not a dict");
        return -1;
    }
    p->self = Py_NewRef(self);
    p->config = Py_NewRef(config);
    p->prior = PyDict_New();
    if (p->prior == NULL) {
        return -1;
    }
    /* prior = {k: config[k].user_override.get() for k in changes}
     * (2.11: config[k].user_override) */
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(changes, &pos, &k, &v)) {
        Py_INCREF(k);
        PyObject *entry = PyObject_GetItem(config, k);
        PyObject *var = entry ? PyObject_GetAttr(entry, r->str_user_override) : NULL;
        PyObject *old = var == NULL || form == RT_PATCH_ATTRIBUTE
                            ? Py_XNewRef(var)
                            : var_get(r, var);
        int rc = old ? PyDict_SetItem(p->prior, k, old) : -1;
        Py_XDECREF(entry);
        Py_XDECREF(var);
        Py_XDECREF(old);
        Py_DECREF(k);
        if (rc < 0) {
            return -1;
        }
    }
    return apply_all(st, p, changes);
}

int
rt_config_patch_exit(rt_state *st, rt_config_patch *p)
{
    return apply_all(st, p, p->prior);
}

void
rt_config_patch_clear(rt_config_patch *p)
{
    Py_CLEAR(p->self);
    Py_CLEAR(p->config);
    Py_CLEAR(p->prior);
}
