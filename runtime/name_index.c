/* name -> index maps over glibc's tsearch (a red-black tree: O(log n) per operation). */
#include "runtime/name_index.h"

#include <search.h>
#include <stdlib.h>
#include <string.h>

typedef struct nidx_node {
    const char *name;
    size_t i;
} nidx_node;

static int cmp_node(const void *a, const void *b) {
    return strcmp(((const nidx_node *)a)->name, ((const nidx_node *)b)->name);
}

void nidx_init(nidx *m) {
    m->root = NULL;
    m->n = 0;
}

int nidx_add(nidx *m, const char *name, size_t i, size_t *prev) {
    nidx_node *nd = malloc(sizeof *nd);
    if (!nd) return -1;
    nd->name = name;
    nd->i = i;
    void *slot = tsearch(nd, &m->root, cmp_node);
    if (!slot) {
        free(nd);
        return -1;
    }
    const nidx_node *in = *(nidx_node *const *)slot;
    if (in != nd) {
        free(nd);
        if (prev) *prev = in->i;
        return 1;
    }
    m->n++;
    return 0;
}

long nidx_get(const nidx *m, const char *name) {
    nidx_node key = {name, 0};
    void *slot = tfind(&key, &m->root, cmp_node);
    return slot ? (long)(*(nidx_node *const *)slot)->i : -1;
}

void nidx_free(nidx *m) {
    if (m->root) tdestroy(m->root, free);
    nidx_init(m);
}
