/* A string -> index hash table (open addressing, linear probing) for the recipe engine's lookups:
 * map keys, YAML anchors, stage ids. Keys are borrowed: the caller keeps each key string alive and
 * unchanged while it is in the table. Every operation is O(1) expected, so building an index of n
 * keys is O(n). */
#ifndef FSDP_PIPELINE_STRMAP_H
#define FSDP_PIPELINE_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct strmap_slot {
    const char *key; /* NULL: empty slot */
    size_t val;
    uint64_t hash;
} strmap_slot;

typedef struct strmap {
    strmap_slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t n;
} strmap;

/* An empty table (no allocation until the first put). */
void strmap_init(strmap *m);
void strmap_free(strmap *m);
/* Sets key -> val, replacing the value of an equal key already there. 0, or -1 when out of memory
 * (the table is unchanged then). */
int strmap_put(strmap *m, const char *key, size_t val);
/* 1 and *val when key is there, else 0. */
int strmap_get(const strmap *m, const char *key, size_t *val);

#endif
