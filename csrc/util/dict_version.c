/* dict_version.c: dict versions from a dict watcher (CPython 3.12 on); see
 * dict_version.h. Up to 3.11 the dict's own version tag serves and this
 * file only answers rt_dict_versions_init.
 *
 * The table maps a watched dict (its end removes it: the watcher hears of
 * it before the dict is freed) to its current version. It is the
 * process's, as the watcher is (a watcher callback has no state of its
 * own); the module declares one interpreter only (py_compat.h). Everything
 * runs under the GIL: a watcher callback runs where the dict changes,
 * before the change, and nothing of ours runs between the two. */
#include "util/dict_version.h"

#if RT_PY_DICT_WATCHERS

#include "util/ptr_map.h"

static int watcher_id = -1;
static rt_ptr_map versions;
static uint64_t last_version;

static int
on_dict_event(PyDict_WatchEvent event, PyObject *d, PyObject *Py_UNUSED(key),
              PyObject *Py_UNUSED(value))
{
    rt_ptr_entry *e = rt_ptr_map_find(&versions, d);
    if (e == NULL) {
        return 0; /* watched by another of our watch calls that found no room */
    }
    if (event == PyDict_EVENT_DEALLOCATED) {
        rt_ptr_map_remove(&versions, e);
    }
    else {
        e->value = ++last_version;
    }
    return 0;
}

uint64_t
rt_watched_dict_version(PyObject *d)
{
    rt_ptr_entry *e = rt_ptr_map_find(&versions, d);
    if (e != NULL) {
        return e->value;
    }
    if (watcher_id < 0 || !PyDict_Check(d)) {
        return 0;
    }
    e = rt_ptr_map_add(&versions, d, last_version + 1);
    if (e == NULL) {
        return 0; /* no memory for the table: unknown */
    }
    if (PyDict_Watch(watcher_id, d) < 0) {
        PyErr_Clear();
        rt_ptr_map_remove(&versions, e);
        return 0;
    }
    return ++last_version;
}

int
rt_dict_versions_init(void)
{
    if (watcher_id >= 0) {
        return 0; /* the module made again in this process: the same watcher */
    }
    watcher_id = PyDict_AddWatcher(on_dict_event);
    if (watcher_id < 0) {
        PyErr_Clear(); /* all taken: versions unknown, checks run every time */
    }
    return 0;
}

#else

int
rt_dict_versions_init(void)
{
    return 0;
}

#endif
