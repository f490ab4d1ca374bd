/* Every rank's numeric metrics of a stage, reduced to min / max / mean on rank 0. */
#include "run/report_ranks.h"

#include <stdlib.h>
#include <string.h>

/* name '\0' then the value's 8 bytes, per numeric metric. */
static char *pack(const ctx_metrics *m, size_t *len) {
    size_t n = 0;
    for (size_t i = 0; i < m->n; i++)
        if (!m->items[i].is_str) n += strlen(m->items[i].name) + 1 + sizeof(double);
    char *buf = malloc(n ? n : 1), *p = buf;
    if (!buf) return NULL;
    for (size_t i = 0; i < m->n; i++) {
        if (m->items[i].is_str) continue;
        size_t k = strlen(m->items[i].name) + 1;
        memcpy(p, m->items[i].name, k);
        memcpy(p + k, &m->items[i].num, sizeof(double));
        p += k + sizeof(double);
    }
    *len = n;
    return buf;
}

static int add_value(run_record *rec, const char *name, double v) {
    for (size_t i = 0; i < rec->n_ranks; i++) {
        report_rank_stat *s = &rec->ranks[i];
        if (strcmp(s->name, name)) continue;
        if (v < s->min) s->min = v;
        if (v > s->max) s->max = v;
        s->sum += v;
        s->n++;
        return 0;
    }
    report_rank_stat *ns = realloc(rec->ranks, (rec->n_ranks + 1) * sizeof *ns);
    if (!ns) return FSDP_E_NOMEM;
    rec->ranks = ns;
    report_rank_stat *s = &rec->ranks[rec->n_ranks];
    if (!(s->name = strdup(name))) return FSDP_E_NOMEM;
    s->min = s->max = s->sum = v;
    s->n = 1;
    rec->n_ranks++;
    return 0;
}

int report_gather_ranks(comm *c, const ctx_metrics *mine, run_record *rec, fsdp_err *err) {
    size_t len = 0;
    char *buf = pack(mine, &len);
    if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    void *all = NULL;
    size_t *sizes = NULL;
    int rc = comm_gather_bytes(c, buf, len, 0, &all, &sizes, err);
    free(buf);
    if (rc || comm_rank(c) != 0) return rc;
    const char *p = all;
    for (int r = 0; r < comm_size(c) && !rc; r++) {
        const char *end = p + sizes[r];
        while (p < end && !rc) {
            const char *nul = memchr(p, '\0', (size_t)(end - p));
            if (!nul || (size_t)(end - nul - 1) < sizeof(double)) break; /* not from pack: ignored */
            double v;
            memcpy(&v, nul + 1, sizeof v);
            if (add_value(rec, p, v)) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            p = nul + 1 + sizeof(double);
        }
        p = end;
    }
    free(all);
    free(sizes);
    return rc;
}
