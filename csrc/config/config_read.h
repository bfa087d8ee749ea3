/* config_read: a read of one torch config setting (torch._dynamo.config.x,
 * torch._functorch.config.x) in C, as ConfigModule.__getattr__
 * (torch/utils/_config_module.py; 2.11's form too) returns it, for the settings the
 * layers read per call (see config_read.c). Bound once by
 * _C._bind_config_read where the release entry says the source is the one
 * mirrored; unbound, a read is PyObject_GetAttr. */
#ifndef TORCH_AOT_RT_CONFIG_READ_H
#define TORCH_AOT_RT_CONFIG_READ_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* How each read ran (stats()["config_reads"]). */
enum rt_config_read_count {
    RT_CFG_C,          /* the setting's value, read in C */
    RT_CFG_UPSTREAM,   /* Python's attribute read (ConfigModule.__getattr__) ran */
    RT_CFG_N
};

/* ConfigModule's methods __getattr__ calls on self (and __getattr__ itself):
 * each must resolve to the function bound. */
enum rt_config_method {
    RT_CFGM_GETATTR,
    RT_CFGM_WARN,        /* _warn_if_deprecated */
    RT_CFGM_ALIAS_VAL,   /* _get_alias_val */
    RT_CFGM_ALIAS_NAME,  /* _get_alias_module_and_name */
    RT_CFGM_N
};

#define RT_CFG_TYPES 4 /* config module classes verified, by type version */
#define RT_CFG_READS 8 /* settings resolved to their entry, by dict versions */

/* A setting whose read was resolved to its _ConfigEntry: valid while the
 * module's class is at the same type version and the module's __dict__, its
 * _config dict and _config_module's globals at the same dict versions
 * (dict_version.h), when every check before the entry's fields passes again
 * unchanged. The fields themselves are read every time. */
typedef struct {
    PyObject *config, *name;        /* the module and the (interned) name */
    PyTypeObject *tp;
    unsigned int tag;
    uint64_t mdict_version, entries_version, globals_version;
    PyObject *entries, *entry, *unset, *immutable;
} rt_config_resolved;

typedef struct {
    PyTypeObject *config_module;          /* ConfigModule, or NULL: not bound */
    int attribute_overrides;              /* 2.11: user_override a plain attribute, no
                                           * deprecation, list/set/dict defaults copied */
    PyObject *copied_types;               /* 2.11: (list, set, dict) */
    PyObject *globals;                    /* torch.utils._config_module.__dict__ */
    PyObject *method_names[RT_CFGM_N];
    PyObject *methods[RT_CFGM_N];         /* the functions in ConfigModule.__dict__ */
    PyObject *str_getattribute, *str_config, *str_unset, *str_immutable;
    PyObject *str_hide, *str_deprecated, *str_warned, *str_alias, *str_force;
    PyObject *str_user_override, *str_env_default, *str_justknob, *str_default;
    /* config_patch.c: ConfigModule._mark_get_dict_dirty (NULL where the
     * class has none: the patcher's hooks are called) and the names the
     * patcher's code uses */
    PyObject *mark_dirty;
    PyObject *module_getattribute;        /* ModuleType.__getattribute__ */
    PyObject *str_mark_dirty, *str_dirty_keys_var, *str_dirty_cap, *str_hash_dirty_var;
    PyObject *str_get, *str_set, *str_add;
    /* classes found to reach ConfigModule.__getattr__, at the type version
     * they were checked at (tp_version_tag changes when they or a base change) */
    PyTypeObject *verified[RT_CFG_TYPES];
    unsigned int verified_tag[RT_CFG_TYPES];
    rt_config_resolved resolved[RT_CFG_READS];
    int next_resolved;                    /* the slot a new one replaces */
    Py_ssize_t counts[RT_CFG_N];
} rt_config_reader;

struct rt_state;
/* config.<name> (a new reference), as Python's attribute read returns it */
PyObject *rt_config_read(struct rt_state *st, PyObject *config, PyObject *name);
/* _C._bind_config_read(config_module, *, attribute_overrides=False):
 * ConfigModule (2.11's form: attribute_overrides), once the shim checked
 * the release mirrors its __getattr__ */
PyObject *rt_bind_config_read(PyObject *module, PyObject *args, PyObject *kwargs);
/* _C._config_read(config, name) */
PyObject *rt_config_read_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* _C._config_read_stats(reset=False) */
PyObject *rt_config_read_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int rt_config_reader_traverse(rt_config_reader *r, visitproc visit, void *arg);
void rt_config_reader_clear(rt_config_reader *r);

#endif
