/* dict_version.c: dict versions from a dict watcher (CPython 3.12 on); see
 * dict_version.h. Up to 3.11 the dict's own version tag serves and this
 * file only answers rt_dict_versions_init.
 *
 * The table maps a watched dict (not a reference: its end removes it, the
 * watcher hears of it before the dict is freed) to its current version, by
 * open addressing with linear probing on the dict's address. It is the
 * process's, as the watcher is (a watcher callback has no state of its
 * own); the module declares one interpreter only (module.c). Everything
 * runs under the GIL: a watcher callback runs where the dict changes,
 * before the change, and nothing of ours runs between the two. */
#include "util/dict_version.h"

#if RT_PY_DICT_WATCHERS

typedef struct {
    PyObject *dict; /* NULL: empty */
    uint64_t version;
} entry;

static int watcher_id = -1;
static entry *table;
static size_t capacity; /* a power of two, or 0 */
static size_t used;
static uint64_t last_version;

static size_t
home(PyObject *d)
{
    /* Fibonacci hashing of the address (objects are 16-byte aligned) */
    uint64_t h = ((uint64_t)(uintptr_t)d >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (capacity - 1);
}

static entry *
find(PyObject *d)
{
    if (capacity == 0) {
        return NULL;
    }
    for (size_t i = home(d);; i = (i + 1) & (capacity - 1)) {
        if (table[i].dict == d) {
            return &table[i];
        }
        if (table[i].dict == NULL) {
            return NULL;
        }
    }
}

static void
place(entry e)
{
    size_t i = home(e.dict);
    while (table[i].dict != NULL) {
        i = (i + 1) & (capacity - 1);
    }
    table[i] = e;
}

/* 0, or -1 (out of memory: no exception set, the dict stays unknown) */
static int
grow(void)
{
    size_t n = capacity ? capacity * 2 : 32;
    entry *old = table, *fresh = PyMem_Calloc(n, sizeof(entry));
    if (fresh == NULL) {
        return -1;
    }
    size_t old_capacity = capacity;
    table = fresh;
    capacity = n;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].dict != NULL) {
            place(old[i]);
        }
    }
    PyMem_Free(old);
    return 0;
}

/* remove e, moving later entries of its run back (no tombstones) */
static void
forget(entry *e)
{
    size_t i = (size_t)(e - table);
    table[i].dict = NULL;
    used--;
    for (size_t j = (i + 1) & (capacity - 1); table[j].dict != NULL; j = (j + 1) & (capacity - 1)) {
        size_t h = home(table[j].dict);
        /* table[j] may move to the hole at i when its home is not in (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            table[i] = table[j];
            table[j].dict = NULL;
            i = j;
        }
    }
}

static int
on_dict_event(PyDict_WatchEvent event, PyObject *d, PyObject *Py_UNUSED(key),
              PyObject *Py_UNUSED(value))
{
    entry *e = find(d);
    if (e == NULL) {
        return 0; /* watched by us once, forgotten when the table could not grow */
    }
    if (event == PyDict_EVENT_DEALLOCATED) {
        forget(e);
    }
    else {
        e->version = ++last_version;
    }
    return 0;
}

uint64_t
rt_watched_dict_version(PyObject *d)
{
    entry *e = find(d);
    if (e != NULL) {
        return e->version;
    }
    if (watcher_id < 0 || ((used + 1) * 2 > capacity && grow() < 0)) {
        return 0;
    }
    if (PyDict_Watch(watcher_id, d) < 0) {
        PyErr_Clear(); /* not a dict: unknown, as documented */
        return 0;
    }
    entry fresh = {d, ++last_version};
    place(fresh);
    used++;
    return fresh.version;
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
