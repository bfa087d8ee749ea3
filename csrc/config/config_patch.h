/* config_patch: the enter hook ConfigModule._make_closure_patcher makes
 * (torch/utils/_config_module.py: its `change`, and the `revert` it returns),
 * run in C for compile_wrapper's enter hooks (dynamic=, dynamic_shapes=).
 * Each is the operations of upstream's code, in its order, through the
 * object protocol (so exact whatever the objects are), without their
 * Python frames; self._mark_get_dict_dirty(k) is done in C where it
 * resolves to ConfigModule's own (bound with the config reader), else
 * called. Three forms (the release's config_patcher, below). */
#ifndef TORCH_AOT_RT_CONFIG_PATCH_H
#define TORCH_AOT_RT_CONFIG_PATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

struct rt_state;

/* The patcher's form, by release (_versions.Release.config_patcher). */
typedef enum {
    RT_PATCH_VAR_MARKED, /* 2.13 on: config[k].user_override.set(v), marked dirty */
    RT_PATCH_VAR,        /* 2.12: self._config[k].user_override.set(v) */
    RT_PATCH_ATTRIBUTE,  /* 2.11: self._config[k].user_override = v */
} rt_patch_form;

/* What change() left for revert(): its closure's self and config, and prior
 * ({k: config[k].user_override[.get()] for k in changes}); new references;
 * and which form ran. */
typedef struct {
    PyObject *self, *config, *prior;
    rt_patch_form form;
} rt_config_patch;

/* change(): closure is the patcher function's (changes, config, self)
 * cells. 0, or -1 with an exception (after what ran of it, as Python). The
 * names it uses are the config reader's: it must be bound. */
int rt_config_patch_enter(struct rt_state *st, PyObject *closure, rt_patch_form form,
                          rt_config_patch *p);
/* revert(): 0, or -1 with an exception. */
int rt_config_patch_exit(struct rt_state *st, rt_config_patch *p);
void rt_config_patch_clear(rt_config_patch *p);

#endif
