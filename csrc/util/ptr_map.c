/* ptr_map.c: see ptr_map.h. */
#include "util/ptr_map.h"

#include <Python.h> /* PyMem_* */

static size_t
home(const rt_ptr_map *m, const void *key)
{
    uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (m->capacity - 1);
}

static rt_ptr_entry *
place(rt_ptr_map *m, rt_ptr_entry e)
{
    size_t i = home(m, e.key);
    while (m->slots[i].key != NULL) {
        i = (i + 1) & (m->capacity - 1);
    }
    m->slots[i] = e;
    return &m->slots[i];
}

static int
grow(rt_ptr_map *m)
{
    size_t n = m->capacity ? m->capacity * 2 : 32;
    rt_ptr_entry *old = m->slots, *fresh = PyMem_Calloc(n, sizeof(rt_ptr_entry));
    if (fresh == NULL) {
        return -1;
    }
    size_t old_capacity = m->capacity;
    m->slots = fresh;
    m->capacity = n;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].key != NULL) {
            place(m, old[i]);
        }
    }
    PyMem_Free(old);
    return 0;
}

rt_ptr_entry *
rt_ptr_map_add(rt_ptr_map *m, const void *key, uint64_t value)
{
    if ((m->used + 1) * 2 > m->capacity && grow(m) < 0) {
        return NULL;
    }
    m->used++;
    return place(m, (rt_ptr_entry){key, value});
}

void
rt_ptr_map_remove(rt_ptr_map *m, rt_ptr_entry *e)
{
    /* backward-shift deletion: each later entry of the run moves into the
     * hole unless its home lies cyclically in (hole, its slot] */
    size_t mask = m->capacity - 1, i = (size_t)(e - m->slots);
    m->slots[i].key = NULL;
    m->used--;
    for (size_t j = (i + 1) & mask; m->slots[j].key != NULL; j = (j + 1) & mask) {
        size_t h = home(m, m->slots[j].key);
        int stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            m->slots[i] = m->slots[j];
            m->slots[j].key = NULL;
            i = j;
        }
    }
}

void
rt_ptr_map_free(rt_ptr_map *m)
{
    PyMem_Free(m->slots);
    m->slots = NULL;
    m->capacity = m->used = 0;
}
