/* ckpt_check: the structural check of a checkpoint's data files (headers only), per format, and
 * its report of problems. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/reader_impl.h"
#include "ckpt/safetensors.h"

int ckpt_check_add(ckpt_check_report *rep, const char *fmt, ...) {
    size_t k = rep->problems++;
    if (k >= CKPT_CHECK_SHOWN) return 0;
    char msg[FSDP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rep->shown[k] = strdup(msg);
    return rep->shown[k] ? 0 : FSDP_E_NOMEM;
}

void ckpt_check_report_free(ckpt_check_report *rep) {
    for (size_t k = 0; k < CKPT_CHECK_SHOWN; k++) free(rep->shown[k]);
    memset(rep, 0, sizeof *rep);
}

int ckpt_check(ckpt_reader *r, ckpt_check_report *rep, fsdp_err *err) {
    memset(rep, 0, sizeof *rep);
    if (r->ops->check) return r->ops->check(r, rep, err); /* a reader over others: their files */
    int rc = 0;
    switch (r->format) {
    case CKPT_DCP: rc = ckpt_check_dcp(r, rep, err); break;
    case CKPT_PT: rc = ckpt_check_pt(r, rep, err); break;
    default: /* safetensors: st_open checked every file and every tensor's data_offsets against it */
        rep->files = st_file_count(r->impl);
        rep->records = r->n;
        break;
    }
    if (rc) return rc;
    if (!rep->problems) return 0;
    const char *first = rep->shown[0] ? rep->shown[0] : "a problem";
    if (rep->problems == 1) return fsdp_err_set(err, FSDP_E_FORMAT, "%s", first);
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s (and %zu more problems)", first, rep->problems - 1);
}
