/* The data file names a `.metadata` names, each kept once (dcp_chunks.h): millions of chunks point at a
 * few thousand files. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp_chunks.h"
#include "runtime/name_index.h"

struct dcp_names {
    dcp_names *next; /* more tables owned with this one (a merge of rank-local files) */
    char **strs;
    size_t n, cap;
    nidx idx;
    const char *last_in, *last_out; /* the last lookup: a chunk's file is most often its neighbour's */
    void **kept;                     /* blocks owned with the names (dcp_names_keep) */
    size_t n_kept;
};

dcp_names *dcp_names_new(void) { return calloc(1, sizeof(dcp_names)); }

const char *dcp_names_intern(dcp_names *t, const char *s) {
    if (!s[0]) return "";
    if (t->last_in == s) return t->last_out;
    long j = nidx_get(&t->idx, s);
    if (j < 0) {
        if (t->n == t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 64;
            char **ns = realloc(t->strs, cap * sizeof *ns);
            if (!ns) return NULL;
            t->strs = ns;
            t->cap = cap;
        }
        char *c = strdup(s);
        if (!c || nidx_add(&t->idx, c, t->n, NULL) < 0) {
            free(c);
            return NULL;
        }
        j = (long)t->n;
        t->strs[t->n++] = c;
    }
    t->last_in = s;
    t->last_out = t->strs[j];
    return t->last_out;
}

int dcp_names_keep(dcp_names *t, void *block) {
    void **k = realloc(t->kept, (t->n_kept + 1) * sizeof *k);
    if (!k) return -1;
    t->kept = k;
    t->kept[t->n_kept++] = block;
    return 0;
}

void dcp_names_chain(dcp_names *t, dcp_names *more) {
    while (t->next) t = t->next;
    t->next = more;
}

void dcp_names_free(dcp_names *t) {
    while (t) {
        dcp_names *next = t->next;
        nidx_free(&t->idx);
        for (size_t i = 0; i < t->n; i++) free(t->strs[i]);
        free(t->strs);
        for (size_t i = 0; i < t->n_kept; i++) free(t->kept[i]);
        free(t->kept);
        free(t);
        t = next;
    }
}
