/* A name -> index map for the tables the runner keeps by name (parameters of the state, items
 * of a checkpoint, files of a DCP directory). Insert and lookup are O(log n) string compares in
 * the worst case whatever the names are (the map is a balanced tree: glibc's tsearch), so that a
 * table of n names read from a file costs O(n log n) to build and to query, never O(n^2).
 *
 * The map does not copy names: each name must stay valid and unchanged while the map holds it
 * (the owners keep their names in heap strings that do not move when their arrays grow). */
#ifndef FSDP_RUNTIME_NAME_INDEX_H
#define FSDP_RUNTIME_NAME_INDEX_H

#include <stddef.h>

typedef struct nidx {
    void *root; /* tsearch tree of nodes {name, index} */
    size_t n;
} nidx;

/* An empty map (a zeroed nidx is one too). */
void nidx_init(nidx *m);
/* Adds name -> i. Returns 0 when added; 1 when the name is already present (the map is left as
 * it was and *prev, when not NULL, receives the index stored for it); -1 when out of memory. */
int nidx_add(nidx *m, const char *name, size_t i, size_t *prev);
/* The index stored for name, or -1 when absent. */
long nidx_get(const nidx *m, const char *name);
/* Frees the map's nodes (not the names) and leaves it empty. */
void nidx_free(nidx *m);

#endif
