/* ptr_map.h: a map from objects (by address, not by value, and holding no
 * reference: whoever inserts a key removes it before the object goes) to a
 * 64-bit value; open addressing with linear probing, no tombstones.
 *
 * For side tables the hot path consults with no dict look-up: a dict's
 * version (dict_version.c), a compiled function's state (the C
 * compile_wrapper, dynamo/compile_wrapper.c). Not thread-safe: used under
 * the GIL. */
#ifndef TORCH_AOT_RT_UTIL_PTR_MAP_H
#define TORCH_AOT_RT_UTIL_PTR_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const void *key; /* NULL: empty */
    uint64_t value;
} rt_ptr_entry;

typedef struct {
    rt_ptr_entry *slots;
    size_t capacity; /* a power of two, or 0 */
    size_t used;
} rt_ptr_map;

/* key's entry, or NULL */
static inline rt_ptr_entry *
rt_ptr_map_find(const rt_ptr_map *m, const void *key)
{
    if (m->capacity == 0) {
        return NULL;
    }
    /* Fibonacci hashing of the address (objects are 16-byte aligned) */
    uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
    for (size_t i = (size_t)(h >> 32) & (m->capacity - 1);; i = (i + 1) & (m->capacity - 1)) {
        if (m->slots[i].key == key) {
            return &m->slots[i];
        }
        if (m->slots[i].key == NULL) {
            return NULL;
        }
    }
}

/* Adds key (not in m) with value: its entry, or NULL when memory ran out
 * (no exception set). */
rt_ptr_entry *rt_ptr_map_add(rt_ptr_map *m, const void *key, uint64_t value);

/* Removes e, an entry of m. */
void rt_ptr_map_remove(rt_ptr_map *m, rt_ptr_entry *e);

/* Frees the slots (the values are the caller's to release first). */
void rt_ptr_map_free(rt_ptr_map *m);

#endif
