/* Gathering validation errors, one line each. */
#include "pipeline/errlist.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void errlist_init(errlist *el) { memset(el, 0, sizeof *el); }

int errlist_add(errlist *el, const fsdp_err *e) {
    if (!e->code) return 0;
    if (!el->n) el->code = e->code;
    size_t need = strlen(e->msg) + (el->n ? 1 : 0);
    /* keep room for the "(and N more errors)" line */
    if (el->n && el->len + need + 64 >= sizeof el->msg) {
        el->dropped++;
    } else {
        snprintf(el->msg + el->len, sizeof el->msg - el->len, "%s%s", el->n ? "\n" : "", e->msg);
        el->len = strlen(el->msg);
    }
    el->n++;
    return e->code;
}

int errlist_finish(const errlist *el, fsdp_err *err) {
    if (!el->n) return 0;
    if (el->dropped)
        return fsdp_err_set(err, el->code, "%s\n(and %d more errors)", el->msg, el->dropped);
    return fsdp_err_set(err, el->code, "%s", el->msg);
}

void errlist_add_at(errlist *el, const fsdp_value *at, const char *fmt, ...) {
    char msg[FSDP_ERR_MSG_MAX - 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fsdp_err e;
    fsdp_err_at(&e, FSDP_E_INVALID, at, "%s", msg);
    errlist_add(el, &e);
}
