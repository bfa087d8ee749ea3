/* A torch config setting read in C: what `torch._dynamo.config.<name>` runs,
 * ConfigModule.__getattr__ (torch/utils/_config_module.py; the same source
 * 2.12 to 2.15, fingerprinted with _warn_if_deprecated, _get_alias_val,
 * _get_alias_module_and_name and _ConfigEntry), for the settings our layers
 * read per call (compile_wrapper's error_on_dynamo_callback_in_fullgraph_
 * compiled_code under fullgraph, ...). In Python the read costs about 16,000
 * instructions; here a few hundred. Mirrored:
 *
 *     config = self._config[name]                 # KeyError -> AttributeError
 *     if config.hide: raise AttributeError(...)
 *     self._warn_if_deprecated(name, config)      # warns once if deprecated
 *     alias_val = self._get_alias_val(config)     # _UNSET_SENTINEL unless aliased
 *     if alias_val is not _UNSET_SENTINEL: return alias_val
 *     if config.env_value_force is not _UNSET_SENTINEL: return config.env_value_force
 *     user_override = config.user_override.get()  # a ContextVar
 *     if user_override is not _UNSET_SENTINEL: return user_override
 *     if config.env_value_default is not _UNSET_SENTINEL: return config.env_value_default
 *     if config.justknob is not None: return justknobs_check(...)
 *     if not isinstance(config.default, _IMMUTABLE_CONFIG_TYPES):
 *         (deep-copied into user_override)
 *     return config.default
 *
 * 2.11's (attribute_overrides): no deprecation warning, `config.user_override`
 * a plain attribute (`is not _UNSET_SENTINEL` -> it), and only a default of
 * (list, set, dict) is copied (there is no _IMMUTABLE_CONFIG_TYPES).
 *
 * C returns the value where that is all the read does; everything else (a
 * hidden, deprecated-and-not-yet-warned, aliased or justknob setting, a
 * mutable default, a missing one) is Python's own read, which re-reads the
 * same fields (reading them has no effect). Python reaches __getattr__ only
 * after the module's own lookup fails: the module's class and its bases
 * before ModuleType define neither `name` nor __getattribute__, the
 * __getattr__ they resolve to is ConfigModule's, as are the methods it calls
 * (checked per class and type version), and the module's __dict__ holds
 * neither `name` nor a PEP 562 __getattr__ nor those methods (checked per
 * read). Else Python's read. */
#include "config/config_read.h"

#include "util/dict_version.h"
#include "util/py_compat.h"
#include "fn_object.h"
#include "state.h"

/* The first class of tp's MRO (a tuple: checked by class_reaches_getattr)
 * before ModuleType whose __dict__ holds key (borrowed), NULL with none (or
 * an error set, *error 1). */
static PyObject *
mro_lookup(PyTypeObject *tp, PyObject *key, int *error)
{
    PyObject *mro = tp->tp_mro;
    *error = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyTypeObject *c = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
        if (c == &PyModule_Type) {
            break;
        }
        PyObject *v = PyDict_GetItemWithError(rt_type_dict(c), key);
        if (v != NULL || PyErr_Occurred()) {
            *error = v == NULL;
            return v;
        }
    }
    return NULL;
}

/* 1: tp's lookup of name, __getattribute__, _config and the methods
 * reaches ConfigModule.__getattr__ and its callees; 0: not; -1: error. */
static int
class_reaches_getattr(rt_config_reader *r, PyTypeObject *tp, PyObject *name)
{
    if (tp->tp_mro == NULL || !PyTuple_Check(tp->tp_mro) ||
        !PyType_IsSubtype(tp, r->config_module)) {
        return 0; /* not a ready class of ours: Python's read */
    }
    PyObject *plain[] = {name, r->str_getattribute, r->str_config};
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
        int error;
        if (mro_lookup(tp, plain[i], &error) != NULL || error) {
            return error ? -1 : 0;
        }
    }
    for (int m = 0; m < RT_CFGM_N; m++) {
        int error;
        if (r->method_names[m] == NULL) {
            continue; /* 2.11: no _warn_if_deprecated */
        }
        PyObject *found = mro_lookup(tp, r->method_names[m], &error);
        if (found != r->methods[m]) {
            return error ? -1 : 0;
        }
    }
    return 1;
}

/* tp verified at its current type version (cached), or now. */
static int
verified_class(rt_config_reader *r, PyTypeObject *tp, PyObject *name)
{
    int tagged = rt_type_tag_valid(tp); /* before the checks */
    for (int i = 0; i < RT_CFG_TYPES; i++) {
        if (r->verified[i] == tp) {
            if (rt_type_unchanged(tp, r->verified_tag[i])) {
                /* the class checks held for this version; the name's own */
                int error;
                if (mro_lookup(tp, name, &error) != NULL || error) {
                    return error ? -1 : 0;
                }
                return 1;
            }
            break;
        }
    }
    int ok = class_reaches_getattr(r, tp, name);
    if (ok <= 0 || !tagged) {
        return ok;
    }
    /* remember it: its slot, else the first free one, else the last */
    int slot = RT_CFG_TYPES - 1;
    for (int i = 0; i < RT_CFG_TYPES; i++) {
        if (r->verified[i] == tp || r->verified[i] == NULL) {
            slot = i;
            break;
        }
    }
    Py_INCREF(tp);
    Py_XSETREF(r->verified[slot], tp);
    r->verified_tag[slot] = tp->tp_version_tag;
    return 1;
}

static void
resolved_clear(rt_config_resolved *c)
{
    Py_CLEAR(c->config);
    Py_CLEAR(c->name);
    Py_CLEAR(c->tp);
    Py_CLEAR(c->entries);
    Py_CLEAR(c->entry);
    Py_CLEAR(c->unset);
    Py_CLEAR(c->immutable);
    c->tag = 0;
    c->mdict_version = c->entries_version = c->globals_version = 0;
}

/* The slot remembering config.name (borrowed), or NULL. */
static rt_config_resolved *
resolved_slot(rt_config_reader *r, PyObject *config, PyObject *name)
{
    for (int i = 0; i < RT_CFG_READS; i++) {
        if (r->resolved[i].config == config && r->resolved[i].name == name) {
            return &r->resolved[i];
        }
    }
    return NULL;
}

/* The resolved read of config.name still valid (borrowed), or NULL. */
static rt_config_resolved *
resolved_find(rt_config_reader *r, PyObject *config, PyObject *name, PyObject *mdict)
{
    rt_config_resolved *c = resolved_slot(r, config, name);
    PyTypeObject *tp = Py_TYPE(config);
    int valid = c != NULL && c->tp == tp && rt_type_unchanged(tp, c->tag) &&
                rt_dict_unchanged(mdict, c->mdict_version) &&
                rt_dict_unchanged(c->entries, c->entries_version) &&
                rt_dict_unchanged(r->globals, c->globals_version);
    return valid ? c : NULL;
}

/* Remembers a read resolved at these versions (nothing where one of them is
 * unknown). */
static void
resolved_remember(rt_config_reader *r, PyObject *config, PyObject *name, PyObject *mdict,
                  PyObject *entries, PyObject *entry, PyObject *unset, PyObject *immutable)
{
    PyTypeObject *tp = Py_TYPE(config);
    uint64_t mv = rt_dict_version(mdict), ev = rt_dict_version(entries);
    uint64_t gv = rt_dict_version(r->globals);
    if (!rt_type_tag_valid(tp) || !mv || !ev || !gv) {
        return;
    }
    rt_config_resolved *c = resolved_slot(r, config, name);
    if (c == NULL) {
        c = &r->resolved[r->next_resolved];
        r->next_resolved = (r->next_resolved + 1) % RT_CFG_READS;
    }
    resolved_clear(c);
    c->config = Py_NewRef(config);
    c->name = Py_NewRef(name);
    c->tp = (PyTypeObject *)Py_NewRef(tp);
    c->tag = tp->tp_version_tag;
    c->mdict_version = mv;
    c->entries_version = ev;
    c->globals_version = gv;
    c->entries = Py_NewRef(entries);
    c->entry = Py_NewRef(entry);
    c->unset = Py_NewRef(unset);
    c->immutable = Py_NewRef(immutable);
}

/* The checks before the entry's fields: 1 with *entry, *unset and
 * *immutable set (borrowed; valid until the next read), 0: Python's read
 * decides; -1: an error reading what upstream reads the same way. */
static int
resolve(rt_config_reader *r, PyObject *config, PyObject *name, PyObject **entry,
        PyObject **unset_out, PyObject **immutable_out)
{
    PyObject *mdict = PyModule_GetDict(config); /* borrowed */
    rt_config_resolved *c = resolved_find(r, config, name, mdict);
    if (c != NULL) {
        *entry = c->entry;
        *unset_out = c->unset;
        *immutable_out = c->immutable;
        return 1;
    }
    int ok = verified_class(r, Py_TYPE(config), name);
    if (ok <= 0) {
        return ok;
    }
    PyObject *shadows[] = {name, r->method_names[RT_CFGM_GETATTR], r->method_names[RT_CFGM_WARN],
                           r->method_names[RT_CFGM_ALIAS_VAL],
                           r->method_names[RT_CFGM_ALIAS_NAME]};
    for (size_t i = 0; i < sizeof(shadows) / sizeof(shadows[0]); i++) {
        if (shadows[i] == NULL) {
            continue;
        }
        if (PyDict_GetItemWithError(mdict, shadows[i]) != NULL || PyErr_Occurred()) {
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    PyObject *entries = PyDict_GetItemWithError(mdict, r->str_config);
    if (entries == NULL || !PyDict_CheckExact(entries)) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *unset = PyDict_GetItemWithError(r->globals, r->str_unset);
    /* 2.11: the types whose default is copied, (list, set, dict) */
    PyObject *immutable = unset == NULL ? NULL
                          : r->attribute_overrides
                              ? r->copied_types
                              : PyDict_GetItemWithError(r->globals, r->str_immutable);
    if (immutable == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *found = PyDict_GetItemWithError(entries, name);
    if (found == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    resolved_remember(r, config, name, mdict, entries, found, unset, immutable);
    *entry = found;
    *unset_out = unset;
    *immutable_out = immutable;
    return 1;
}

/* 1 with *out (a new reference) set: the value; 0: Python's read decides;
 * -1: an error reading what upstream reads the same way. */
static int
read_in_c(rt_config_reader *r, PyObject *config, PyObject *name, PyObject **out)
{
    *out = NULL;
    if (!PyModule_Check(config)) {
        return 0;
    }
    PyObject *entry, *unset, *immutable;
    int ok = resolve(r, config, name, &entry, &unset, &immutable);
    if (ok <= 0) {
        return ok;
    }
    Py_INCREF(entry); /* the entries dict may change under the reads below */
    Py_INCREF(unset);
    Py_INCREF(immutable);
    PyObject *v = NULL;
    int rc = 0;
#define READ(attr)                                  \
    do {                                            \
        Py_XSETREF(v, PyObject_GetAttr(entry, attr)); \
        if (v == NULL) {                            \
            rc = -1;                                \
            goto done;                              \
        }                                           \
    } while (0)
#define TRUTH(t)                                    \
    do {                                            \
        t = PyObject_IsTrue(v);                     \
        if (t < 0) {                                \
            rc = -1;                                \
            goto done;                              \
        }                                           \
    } while (0)
    int t;
    READ(r->str_hide);
    TRUTH(t);
    if (t) {
        goto done; /* hidden: Python raises */
    }
    if (!r->attribute_overrides) {
        READ(r->str_deprecated);
        TRUTH(t);
        if (t) {
            READ(r->str_warned);
            TRUTH(t);
            if (!t) {
                goto done; /* Python warns, once */
            }
        }
    }
    READ(r->str_alias);
    if (v != Py_None) {
        goto done; /* aliased: Python imports and reads the other module */
    }
    READ(r->str_force);
    if (v != unset) {
        goto found;
    }
    READ(r->str_user_override);
    if (r->attribute_overrides) {
        if (v != unset) {
            goto found; /* 2.11: the attribute itself */
        }
    }
    else if (!PyContextVar_CheckExact(v)) {
        goto done;
    }
    else {
        PyObject *value = NULL;
        if (PyContextVar_Get(v, NULL, &value) < 0) {
            rc = -1;
            goto done;
        }
        if (value == NULL) {
            goto done; /* no value, no default: Python's .get() raises */
        }
        Py_SETREF(v, value);
    }
    if (v != unset) {
        goto found;
    }
    READ(r->str_env_default);
    if (v != unset) {
        goto found;
    }
    READ(r->str_justknob);
    if (v != Py_None) {
        goto done; /* Python asks justknobs */
    }
    READ(r->str_default);
    t = PyObject_IsInstance(v, immutable);
    if (r->attribute_overrides ? t != 0 : t <= 0) {
        /* a mutable default: Python copies it into user_override */
        rc = t < 0 ? -1 : 0;
        goto done;
    }
found:
    *out = v;
    v = NULL;
    rc = 1;
done:
#undef READ
#undef TRUTH
    Py_XDECREF(v);
    Py_DECREF(entry);
    Py_DECREF(unset);
    Py_DECREF(immutable);
    return rc;
}

PyObject *
rt_config_read(rt_state *st, PyObject *config, PyObject *name)
{
    rt_config_reader *r = &st->config_reader;
    if (r->config_module != NULL) {
        PyObject *value;
        int rc = read_in_c(r, config, name, &value);
        if (rc != 0) {
            if (rc > 0) {
                r->counts[RT_CFG_C]++;
            }
            return value; /* NULL with the error of a read upstream makes too */
        }
        r->counts[RT_CFG_UPSTREAM]++;
    }
    return PyObject_GetAttr(config, name);
}

/* ---- binding, counts ----------------------------------------------------------- */

#define CFG_STRINGS(X)                                                                 \
    X(str_getattribute, "__getattribute__") X(str_config, "_config")                  \
    X(str_unset, "_UNSET_SENTINEL") X(str_immutable, "_IMMUTABLE_CONFIG_TYPES")        \
    X(str_hide, "hide") X(str_deprecated, "deprecated")                                \
    X(str_warned, "_deprecation_warned") X(str_alias, "alias")                         \
    X(str_force, "env_value_force") X(str_user_override, "user_override")              \
    X(str_env_default, "env_value_default") X(str_justknob, "justknob")                \
    X(str_default, "default") X(str_mark_dirty, "_mark_get_dict_dirty")               \
    X(str_dirty_keys_var, "_get_dict_dirty_keys_var")                                 \
    X(str_dirty_cap, "_GET_DICT_DIRTY_KEYS_CAP") X(str_hash_dirty_var, "_hash_dirty_var") \
    X(str_get, "get") X(str_set, "set") X(str_add, "add")

static const char *const method_names[RT_CFGM_N] = {
    [RT_CFGM_GETATTR] = "__getattr__",
    [RT_CFGM_WARN] = "_warn_if_deprecated",
    [RT_CFGM_ALIAS_VAL] = "_get_alias_val",
    [RT_CFGM_ALIAS_NAME] = "_get_alias_module_and_name",
};

int
rt_config_reader_traverse(rt_config_reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->config_module);
    Py_VISIT(r->globals);
    Py_VISIT(r->mark_dirty);
    Py_VISIT(r->copied_types);
    Py_VISIT(r->module_getattribute);
#define VISIT(f, text) Py_VISIT(r->f);
    CFG_STRINGS(VISIT)
#undef VISIT
    for (int m = 0; m < RT_CFGM_N; m++) {
        Py_VISIT(r->method_names[m]);
        Py_VISIT(r->methods[m]);
    }
    for (int i = 0; i < RT_CFG_TYPES; i++) {
        Py_VISIT(r->verified[i]);
    }
    for (int i = 0; i < RT_CFG_READS; i++) {
        rt_config_resolved *c = &r->resolved[i];
        Py_VISIT(c->config);
        Py_VISIT(c->name);
        Py_VISIT(c->tp);
        Py_VISIT(c->entries);
        Py_VISIT(c->entry);
        Py_VISIT(c->unset);
        Py_VISIT(c->immutable);
    }
    return 0;
}

void
rt_config_reader_clear(rt_config_reader *r)
{
    Py_CLEAR(r->config_module);
    Py_CLEAR(r->globals);
    Py_CLEAR(r->mark_dirty);
    Py_CLEAR(r->copied_types);
    r->attribute_overrides = 0;
    Py_CLEAR(r->module_getattribute);
#define CLEAR(f, text) Py_CLEAR(r->f);
    CFG_STRINGS(CLEAR)
#undef CLEAR
    for (int m = 0; m < RT_CFGM_N; m++) {
        Py_CLEAR(r->method_names[m]);
        Py_CLEAR(r->methods[m]);
    }
    for (int i = 0; i < RT_CFG_TYPES; i++) {
        Py_CLEAR(r->verified[i]);
        r->verified_tag[i] = 0;
    }
    for (int i = 0; i < RT_CFG_READS; i++) {
        resolved_clear(&r->resolved[i]);
    }
    r->next_resolved = 0;
}

PyObject *
rt_bind_config_read(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"config_module", "attribute_overrides", NULL};
    PyObject *config_module;
    int attribute_overrides = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$p:_bind_config_read", keywords,
                                     &config_module, &attribute_overrides)) {
        return NULL;
    }
    rt_state *st = PyModule_GetState(module);
    rt_config_reader *r = &st->config_reader;
    if (!PyType_Check(config_module) ||
        !PyType_IsSubtype((PyTypeObject *)config_module, &PyModule_Type)) {
        PyErr_SetString(PyExc_TypeError, "_bind_config_read: ConfigModule, a ModuleType");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)config_module;
    PyObject *module_name = PyObject_GetAttrString(config_module, "__module__");
    PyObject *home = module_name ? PyImport_GetModule(module_name) : NULL;
    if (home == NULL && module_name != NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "_bind_config_read: %R is not imported", module_name);
    }
    Py_XDECREF(module_name);
    if (home == NULL) {
        return NULL;
    }
    rt_config_reader_clear(r);
    r->globals = Py_NewRef(PyModule_GetDict(home));
    Py_DECREF(home);
#define INTERN(f, text)                               \
    if ((r->f = PyUnicode_InternFromString(text)) == NULL) { \
        goto error;                                   \
    }
    CFG_STRINGS(INTERN)
#undef INTERN
    r->attribute_overrides = attribute_overrides;
    if (attribute_overrides) {
        r->copied_types = PyTuple_Pack(3, (PyObject *)&PyList_Type, (PyObject *)&PySet_Type,
                                       (PyObject *)&PyDict_Type);
        if (r->copied_types == NULL) {
            goto error;
        }
    }
    for (int m = 0; m < RT_CFGM_N; m++) {
        if (attribute_overrides && m == RT_CFGM_WARN) {
            continue; /* 2.11's __getattr__ warns of nothing */
        }
        r->method_names[m] = PyUnicode_InternFromString(method_names[m]);
        if (r->method_names[m] == NULL) {
            goto error;
        }
        PyObject *fn = PyDict_GetItemWithError(rt_type_dict(cls), r->method_names[m]);
        if (fn == NULL || !PyFunction_Check(fn)) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError,
                             "_bind_config_read: ConfigModule.%U is not a function",
                             r->method_names[m]);
            }
            goto error;
        }
        r->methods[m] = Py_NewRef(fn);
    }
    /* 2.13 on: what the closure patcher's change calls per key */
    PyObject *mark = PyDict_GetItemWithError(rt_type_dict(cls), r->str_mark_dirty);
    if (mark == NULL && PyErr_Occurred()) {
        goto error;
    }
    r->mark_dirty = mark != NULL && PyFunction_Check(mark) ? Py_NewRef(mark) : NULL;
    r->module_getattribute = PyDict_GetItemWithError(rt_type_dict(&PyModule_Type), r->str_getattribute);
    if (r->module_getattribute == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "_bind_config_read: ModuleType.__getattribute__");
        }
        goto error;
    }
    Py_INCREF(r->module_getattribute);
    /* last: a reader is in use once config_module is set */
    r->config_module = (PyTypeObject *)Py_NewRef(config_module);
    Py_RETURN_NONE;
error:
    rt_config_reader_clear(r);
    return NULL;
}

/* _C._config_read(config, name): what the layers' reads return (the tests'
 * entry: a read of each setting, C against Python's) */
PyObject *
rt_config_read_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_config_read(config, name): name a str");
        return NULL;
    }
    return rt_config_read(PyModule_GetState(module), args[0], args[1]);
}

static const char *const count_names[RT_CFG_N] = {
    [RT_CFG_C] = "in C",
    [RT_CFG_UPSTREAM] = "upstream's",
};

PyObject *
rt_config_read_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_config_reader *r = &((rt_state *)PyModule_GetState(module))->config_reader;
    return rt_counts_dict("_config_read_stats", args, nargs, count_names, r->counts, RT_CFG_N);
}
