/* Several validation errors gathered into one fsdp_err, one per line (so that `validate` reports
 * every error it finds in a recipe section, not only the first). */
#ifndef FSDP_PIPELINE_ERRLIST_H
#define FSDP_PIPELINE_ERRLIST_H

#include <stddef.h>

#include "fsdp/error.h"
#include "fsdp/value.h"

typedef struct errlist {
    char msg[FSDP_ERR_MSG_MAX];
    size_t len;
    int n;       /* errors added */
    int dropped; /* errors that did not fit */
    int code;    /* the first error's code */
} errlist;

void errlist_init(errlist *el);
/* Adds the error in e (when e->code is set); returns e->code. */
int errlist_add(errlist *el, const fsdp_err *e);
/* Adds an invalid-value error at `at` (file:line:col), formatted like printf. */
void errlist_add_at(errlist *el, const fsdp_value *at, const char *fmt, ...) FSDP_PRINTF(3, 4);
/* 0 when nothing was added, else sets err to every message (the first error's code) and returns it. */
int errlist_finish(const errlist *el, fsdp_err *err);

#endif
