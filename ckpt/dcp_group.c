/* Grouping DCP write records by key (see dcp_group.h). */
#include "ckpt/dcp_group.h"

#include <stdlib.h>

#include "runtime/name_index.h"

int dcp_records_group(const dcp_record *recs, size_t n, size_t **order, size_t **starts, size_t *nk, fsdp_err *err) {
    *order = *starts = NULL;
    *nk = 0;
    size_t *group = malloc((n ? n : 1) * sizeof *group), *first = malloc((n ? n : 1) * sizeof *first);
    size_t *ord = malloc((n ? n : 1) * sizeof *ord), *st = calloc(n + 2, sizeof *st);
    nidx keys;
    nidx_init(&keys);
    int rc = group && first && ord && st ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        size_t g;
        int dup = nidx_add(&keys, recs[i].fqn, *nk, &g);
        if (dup < 0) {
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        } else if (!dup) {
            g = (*nk)++;
            first[g] = i;
        } else if (recs[first[g]].is_tensor != recs[i].is_tensor || !recs[i].is_tensor) {
            rc = fsdp_err_set(err, FSDP_E_INVALID, "DCP save: key %s written twice", recs[i].fqn);
        }
        group[i] = g;
    }
    if (!rc) { /* counting sort by group, stable */
        for (size_t i = 0; i < n; i++) st[group[i] + 1]++;
        for (size_t g = 0; g < *nk; g++) st[g + 1] += st[g];
        size_t *at = first; /* reused as the fill position of each group */
        for (size_t g = 0; g < *nk; g++) at[g] = st[g];
        for (size_t i = 0; i < n; i++) ord[at[group[i]]++] = i;
    }
    nidx_free(&keys);
    free(group);
    free(first);
    if (rc) {
        free(ord);
        free(st);
        *nk = 0;
        return rc;
    }
    *order = ord;
    *starts = st;
    return 0;
}
