/* ckrs_write_rank (ckpt_reshard.h). */
#include "ckpt/ckpt_reshard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_stream_out.h"
#include "ckpt/state_resume.h"
#include "runtime/shard.h"

int ckrs_is_loader_key(const char *name) {
    if (!strcmp(name, "dataloader.world_size")) return 1;
    const char *p = "dataloader.dp_rank_";
    if (strncmp(name, p, strlen(p))) return 0;
    const char *d = name + strlen(p);
    if (!*d) return 0;
    for (; *d; d++)
        if (*d < '0' || *d > '9') return 0;
    return 1;
}

typedef struct loader_add {
    dcp_file_writer *fw;
    dcp_record *recs;
    size_t *nrec;
} loader_add;

static int add_loader_value(void *user, const char *key, pkl_w *w, fsdp_err *err) {
    loader_add *a = user;
    if (w->oom) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = dcp_file_add_value(a->fw, key, w->buf, w->len, &a->recs[(*a->nrec)++], err);
    w->len = 0;
    return rc;
}

static int nested(int rc, const ckrs_entry *e, dcp_record *rec) {
    if (!rc && e->nest > 0) rec->nest = e->nest, rec->tail = e->tail, rec->int_mask = e->int_mask;
    return rc;
}

/* Value k as the pickle it was read from (a DCP byte item byte for byte), so that torch.load /
 * dcp.load read back the same value. */
static int write_value(const ckrs_src *s, size_t k, dcp_file_writer *fw, dcp_record *rec, fsdp_err *err) {
    void *p;
    size_t len;
    int rc = ckpt_value_pickle(s->r, s->e[k].i, &p, &len, err);
    if (!rc) rc = nested(dcp_file_add_pickle(fw, s->e[k].name, p, len, rec, err), &s->e[k], rec);
    free(p);
    return rc;
}

/* The values of rank: rank 0 every one (byte for byte) but the per-rank dataloader entries, which
 * every rank then writes for the M ranks when the source has some. */
static int write_values(const ckrs_src *s, int rank, dcp_file_writer *fw, dcp_record *recs, size_t *nrec,
                        fsdp_err *err) {
    int loader = 0, rc = 0;
    for (size_t k = 0; k < s->n && !rc; k++) {
        const ckpt_entry *e = ckpt_entry_at(s->r, s->e[k].i);
        if (e->is_tensor) continue;
        if (s->regen_loader && ckrs_is_loader_key(s->e[k].name)) {
            loader = 1;
            continue;
        }
        if (rank == 0) rc = write_value(s, k, fw, &recs[(*nrec)++], err);
    }
    if (!rc && loader) {
        loader_add a = {fw, recs, nrec};
        rc = sres_dataloader(rank, s->world, add_loader_value, &a, err);
    }
    return rc;
}

/* Rows [r0, r0 + rows) of tensor k read whole through s->read_whole (the tensor's own chunk when
 * the stream cannot take it). */
static int write_whole(const ckrs_src *s, size_t k, const ckpt_entry *e, const int64_t *off, const int64_t *sizes,
                       dcp_file_writer *fw, dcp_record *rec, fsdp_err *err) {
    void *buf = NULL;
    int rc = s->read_whole(s->user, s->e[k].i, s->e[k].dt, &buf, err);
    if (rc) return rc;
    int64_t per = 1;
    for (int d = 1; d < e->ndim; d++) per *= e->shape[d];
    const char *p = (const char *)buf + (size_t)(e->ndim ? off[0] : 0) * (size_t)per * fsdp_dtype_size(s->e[k].dt);
    if (e->ndim && sizes[0] == 0) p = buf; /* an empty shard: nothing is read from it */
    rc = dcp_file_add_tensor(fw, s->e[k].name, s->e[k].dt, e->ndim, e->shape, off, sizes, p, rec, err);
    free(buf);
    return rc;
}

/* The chunk of rank r of tensor k (resolved into src when *ok) appended to fw. */
static int write_chunk(const ckrs_src *s, size_t k, const ckpt_entry *e, int r, cks_src *src, int ok,
                       dcp_file_writer *fw, dcp_record *rec, fsdp_err *err) {
    int64_t row0 = 0, rows = e->ndim ? e->shape[0] : 1;
    if (e->ndim) shard_rows(e->shape[0], s->world, r, &row0, &rows);
    int64_t off[FSDP_MAX_DIMS] = {0}, sizes[FSDP_MAX_DIMS];
    memcpy(sizes, e->shape, sizeof sizes);
    if (e->ndim) {
        sizes[0] = rows;
        /* an empty shard records the dimension size as its offset (as save-dcp, PyTorch >= 2.8) */
        off[0] = rows == 0 && s->world > 1 ? e->shape[0] : row0;
    }
    if (!ok) return nested(write_whole(s, k, e, off, sizes, fw, rec, err), &s->e[k], rec);
    int64_t a = e->ndim ? off[0] : 0, b = e->ndim ? off[0] + rows : 1;
    return nested(cks_to_dcp(src, a, b, s->e[k].name, s->e[k].dt, e->ndim, e->shape, fw, &s->o, rec, err), &s->e[k], rec);
}

/* Aliases kept (ckrs_src.same_bytes): for each written entry, its source index's position in s->e,
 * and the record of each entry on each rank. Empty (pos NULL) when the source has no alias. */
typedef struct alias_map {
    long *pos;   /* source index -> position in s->e (-1: not written) */
    size_t *rec; /* [k * ranks + (r - lo)]: entry k's record on rank r (SIZE_MAX: none) */
    int ranks;
} alias_map;

static int alias_map_init(const ckrs_src *s, int lo, int hi, alias_map *m, fsdp_err *err) {
    memset(m, 0, sizeof *m);
    size_t n = ckpt_count(s->r);
    int any = 0;
    for (size_t k = 0; k < s->n && !any; k++) any = ckpt_entry_at(s->r, s->e[k].i)->is_alias;
    if (!any) return 0;
    m->ranks = hi - lo;
    m->pos = malloc((n ? n : 1) * sizeof *m->pos);
    m->rec = malloc((s->n ? s->n : 1) * (size_t)m->ranks * sizeof *m->rec);
    if (!m->pos || !m->rec) {
        free(m->pos);
        free(m->rec);
        memset(m, 0, sizeof *m);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) m->pos[i] = -1;
    for (size_t k = 0; k < s->n; k++) m->pos[s->e[k].i] = (long)k;
    for (size_t q = 0; q < s->n * (size_t)m->ranks; q++) m->rec[q] = SIZE_MAX;
    return 0;
}

/* The entry k is written as an alias of (the position of) an earlier one: its index, else -1. */
static long alias_source(const ckrs_src *s, const alias_map *m, size_t k) {
    const ckpt_entry *e = ckpt_entry_at(s->r, s->e[k].i);
    if (!m->pos || !e->is_alias) return -1;
    long j = m->pos[e->alias_of];
    if (j < 0 || (size_t)j >= k || s->e[j].dt != s->e[k].dt) return -1;
    if (s->same_bytes && !s->same_bytes(s->user, s->e[k].i, s->e[j].i)) return -1;
    return j;
}

/* entry k's records on ranks [lo, hi): entry j's under k's name */
static void alias_records(const ckrs_src *s, const alias_map *m, size_t k, size_t j, int lo, int hi,
                          dcp_record **recs, size_t *nrec) {
    for (int r = lo; r < hi; r++) {
        size_t at = m->rec[j * (size_t)m->ranks + (size_t)(r - lo)];
        if (at == SIZE_MAX) continue; /* a 0-d tensor off rank 0 */
        dcp_record *x = &recs[r - lo][nrec[r - lo]];
        *x = recs[r - lo][at];
        snprintf(x->fqn, sizeof x->fqn, "%s", s->e[k].name);
        m->rec[k * (size_t)m->ranks + (size_t)(r - lo)] = nrec[r - lo]++;
    }
}

int ckrs_write_ranks(const ckrs_src *s, int lo, int hi, dcp_file_writer *fw, cks_files *fc, dcp_record **recs,
                     size_t *nrec, fsdp_err *err) {
    alias_map m;
    int rc = alias_map_init(s, lo, hi, &m, err);
    for (int r = lo; r < hi; r++) nrec[r - lo] = 0;
    for (int r = lo; r < hi && !rc && s->values_first; r++)
        rc = write_values(s, r, &fw[r - lo], recs[r - lo], &nrec[r - lo], err);
    for (size_t k = 0; k < s->n && !rc; k++) {
        const ckpt_entry *e = ckpt_entry_at(s->r, s->e[k].i);
        if (!e->is_tensor && !s->values_first && lo == 0) { /* in the source's order, rank 0's */
            rc = write_value(s, k, &fw[0], &recs[0][nrec[0]++], err);
            continue;
        }
        if (!e->is_tensor) continue;
        if (s->e[k].parts) { /* a stack of parts (experts) */
            rc = ckrs_write_stack(s, k, lo, hi, fw, fc, recs, nrec, err);
            continue;
        }
        long j = alias_source(s, &m, k);
        if (j >= 0) {
            alias_records(s, &m, k, (size_t)j, lo, hi, recs, nrec);
            continue;
        }
        cks_src src;
        int ok = 0;
        if ((!s->can_stream || s->can_stream(s->user, s->e[k].i)) &&
            (rc = cks_src_resolve(s->r, s->e[k].i, fc, &src, &ok, err)))
            break;
        /* the ranks in order: the tensor's stored records are read once, front to back, and their
         * CRCs checked (a rank alone reads part of a record, which its CRC cannot check) */
        for (int r = lo; r < hi && !rc; r++) {
            if (e->ndim == 0 && r != 0) continue; /* a 0-d value: rank 0's */
            if (m.rec) m.rec[k * (size_t)m.ranks + (size_t)(r - lo)] = nrec[r - lo];
            rc = write_chunk(s, k, e, r, &src, ok, &fw[r - lo], &recs[r - lo][nrec[r - lo]++], err);
        }
        if (ok) cks_src_free(&src);
    }
    free(m.pos);
    free(m.rec);
    return rc;
}
