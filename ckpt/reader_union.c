/* ckpt_reader over several readers (ckpt/reader_union.h). */
#include "ckpt/reader_union.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/reader_impl.h"

typedef struct un_impl {
    ckpt_reader **part;
    size_t n;
    size_t *first; /* index of part k's first entry */
    char **names;
    size_t n_names;
} un_impl;

static size_t part_of(const un_impl *u, size_t i, size_t *j) {
    size_t k = u->n - 1;
    while (k > 0 && u->first[k] > i) k--;
    *j = i - u->first[k];
    return k;
}

static int un_read_rows(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                        fsdp_err *err) {
    un_impl *u = r->impl;
    size_t j, k = part_of(u, i, &j);
    return ckpt_read_rows_nan(u->part[k], j, r0, r1, dst, dt, nan, err);
}

static const char *un_value_text(ckpt_reader *r, size_t i) {
    un_impl *u = r->impl;
    size_t j, k = part_of(u, i, &j);
    return ckpt_value_text(u->part[k], j);
}

static long un_same(const ckpt_reader *r, size_t i, ckpt_reader **src) {
    const un_impl *u = r->impl;
    if (i >= r->n) return -1;
    size_t j, k = part_of(u, i, &j);
    if (src) *src = u->part[k];
    return (long)j;
}

static int un_verify(ckpt_reader *r, size_t *records, fsdp_err *err) {
    un_impl *u = r->impl;
    *records = 0;
    for (size_t k = 0; k < u->n; k++) {
        size_t n = 0;
        int rc = ckpt_verify(u->part[k], &n, err);
        if (rc) return rc;
        *records += n;
    }
    return 0;
}

static int un_check(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err) {
    un_impl *u = r->impl;
    memset(rep, 0, sizeof *rep);
    int rc = 0;
    for (size_t k = 0; k < u->n && !rc; k++) {
        ckpt_check_report one;
        rc = ckpt_check(u->part[k], &one, err);
        rep->files += one.files, rep->records += one.records;
        for (size_t p = 0; p < one.problems && p < CKPT_CHECK_SHOWN; p++)
            if (one.shown[p]) ckpt_check_add(rep, "%s", one.shown[p]);
        if (one.problems > CKPT_CHECK_SHOWN) rep->problems += one.problems - CKPT_CHECK_SHOWN;
        ckpt_check_report_free(&one);
    }
    return rc;
}

static void un_free(un_impl *u) {
    for (size_t k = 0; k < u->n; k++) ckpt_close(u->part[k]);
    free(u->part);
    free(u->first);
    free(u);
}

static void un_close(ckpt_reader *r) {
    un_impl *u = r->impl;
    for (size_t i = 0; i < u->n_names; i++) free(u->names[i]);
    free(u->names);
    un_free(u);
    ckpt_reader_free(r);
}

static const ckpt_ops un_ops = {un_read_rows, un_value_text, un_close, NULL, un_same, un_verify, un_check};

int ckpt_union_open(const char *path, ckpt_reader **parts, const char *const *prefix, size_t n, ckpt_reader **out,
                    fsdp_err *err) {
    *out = NULL;
    un_impl *u = calloc(1, sizeof *u);
    size_t total = 0;
    for (size_t k = 0; k < n; k++) total += ckpt_count(parts[k]);
    if (u) u->part = malloc((n ? n : 1) * sizeof *u->part), u->first = calloc(n ? n : 1, sizeof *u->first),
               u->names = calloc(total ? total : 1, sizeof *u->names);
    ckpt_reader *r = u && u->part && u->first && u->names ? ckpt_reader_alloc(path, total, &un_ops,
                                                                              n ? ckpt_reader_format(parts[0]) : CKPT_PT, u)
                                                          : NULL;
    if (!r) {
        for (size_t k = 0; k < n; k++) ckpt_close(parts[k]);
        if (u) free(u->part), free(u->first), free(u->names), free(u);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    memcpy(u->part, parts, n * sizeof *parts);
    u->n = n;
    u->n_names = total;
    int rc = 0;
    size_t i = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        u->first[k] = i;
        for (size_t j = 0; j < ckpt_count(parts[k]) && !rc; j++, i++) {
            const ckpt_entry *e = ckpt_entry_at(parts[k], j);
            size_t len = strlen(prefix[k]) + strlen(e->name) + 1;
            if (!(u->names[i] = malloc(len))) {
                rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
                break;
            }
            snprintf(u->names[i], len, "%s%s", prefix[k], e->name);
            r->entries[i] = *e;
            r->entries[i].name = u->names[i];
            r->entries[i].is_alias = 0; /* its index is the part's */
            size_t prev;
            int a = nidx_add(&r->names, u->names[i], i, &prev);
            if (a < 0) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            else if (a > 0) rc = fsdp_err_set(err, FSDP_E_INVALID, "%s: two entries would be named %s", path, u->names[i]);
        }
    }
    if (rc) {
        un_close(r);
        return rc;
    }
    r->identity = n ? ckpt_identity(parts[0]) : 0;
    *out = r;
    return 0;
}
