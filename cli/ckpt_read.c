/* Whole-tensor reads of the ckpt tools (see ckpt_tool.h). */
#include <stdlib.h>

#include "cli/ckpt_tool.h"

int ckpt_tool_bytes(const ckpt_entry *e, size_t esz, size_t *bytes, fsdp_err *err) {
    int64_t n = fsdp_numel(e->ndim, e->shape);
    if (n < 0 || __builtin_mul_overflow((uint64_t)(n ? n : 1), (uint64_t)esz, bytes))
        return fsdp_err_set(err, FSDP_E_FORMAT, "corrupt: tensor %s: its size overflows 64 bits", e->name);
    return 0;
}

int ckpt_tool_read(ckpt_reader *r, size_t i, fsdp_dtype dt, nmap_dir dir, const nmap_info *info, void **buf,
                   fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, i);
    int64_t n = fsdp_numel(e->ndim, e->shape), rows = e->ndim ? e->shape[0] : 1;
    size_t esz = fsdp_dtype_size(dt), bytes = 0;
    int rc = ckpt_tool_bytes(e, esz, &bytes, err);
    if (rc) return rc;
    void *b = malloc(bytes);
    if (!b) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (%zu bytes for tensor %s)", bytes, e->name);
    rc = ckpt_read_rows(r, i, 0, rows, b, dt, err);
    if (!rc && info && info->qk != NMAP_QK_NONE) {
        void *p = malloc(bytes);
        if (!p) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory (%zu bytes for tensor %s)", bytes, e->name);
        else {
            rc = nmap_permute_rows(dir, p, b, rows, n / (rows ? rows : 1), esz, info->heads, err);
            free(b);
            b = p;
        }
    }
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    return 0;
}
