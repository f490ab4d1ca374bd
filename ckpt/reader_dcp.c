/* ckpt_reader over DCP directories. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp.h"
#include "ckpt/reader_impl.h"
#include "runtime/checked.h"

static int dcp_rows_op(ckpt_reader *r, size_t i, int64_t r0, int64_t r1, void *dst, fsdp_dtype dt, int *nan,
                       fsdp_err *err) {
    dcp_ckpt *c = r->impl;
    const dcp_item *x = &c->items[i];
    int64_t off[FSDP_MAX_DIMS] = {0}, len[FSDP_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) len[d] = x->shape[d];
    if (x->ndim > 0) {
        off[0] = r0;
        len[0] = r1 - r0;
    }
    return dcp_read_box_nan(c, i, off, len, dst, dt, nan, err);
}

static const char *dcp_text_op(ckpt_reader *r, size_t i) { return dcp_value_text(r->impl, i); }

static void dcp_close_op(ckpt_reader *r) {
    dcp_close(r->impl);
    ckpt_reader_free(r);
}

static const ckpt_ops DCP_OPS = {dcp_rows_op, dcp_text_op, dcp_close_op};

int ckpt_open_dcp(const char *path, ckpt_reader **out, fsdp_err *err) {
    dcp_ckpt *c;
    int rc = dcp_open(path, &c, err);
    if (rc) return rc;
    ckpt_reader *r = ckpt_reader_alloc(path, c->n, &DCP_OPS, CKPT_DCP, c);
    if (!r) {
        dcp_close(c);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < c->n; i++) {
        const dcp_item *x = &c->items[i];
        ckpt_entry *e = &r->entries[i];
        e->name = x->fqn;
        e->is_tensor = x->is_tensor;
        e->dtype = x->dtype;
        e->ndim = x->ndim;
        memcpy(e->shape, x->shape, sizeof e->shape);
        e->chunks = (int)x->n_chunks;
        if (x->is_tensor) {
            int64_t nbytes;
            if (chk_shape_bytes(x->ndim, x->shape, fsdp_dtype_size(x->dtype), &nbytes)) { /* dcp_open checked it */
                ckpt_close(r);
                return fsdp_err_set(err, FSDP_E_FORMAT, "checkpoint %s: %s: corrupt .metadata: the size overflows",
                                    path, x->fqn);
            }
            e->nbytes = (uint64_t)nbytes;
        } else {
            e->nbytes = x->where.length;
        }
    }
    *out = r;
    return 0;
}
