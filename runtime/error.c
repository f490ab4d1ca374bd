/* The error struct of every call (include/fsdp/error.h): setting, prefixing, codes and exit codes. */
#include "fsdp/error.h"

#include <stdio.h>
#include <string.h>

int fsdp_err_setv(fsdp_err *err, int code, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

int fsdp_err_set(fsdp_err *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fsdp_err_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int fsdp_err_prefix(fsdp_err *err, const char *fmt, ...) {
    if (!err) return FSDP_E_RUNTIME;
    char prefix[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[FSDP_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    size_t pl = strlen(prefix), ol = strnlen(old, sizeof old - 1), cap = sizeof err->msg - 1;
    if (pl > cap) pl = cap;
    memcpy(err->msg, prefix, pl);
    size_t off = pl;
    if (off + 2 <= cap) {
        memcpy(err->msg + off, ": ", 2);
        off += 2;
    }
    if (ol > cap - off) ol = cap - off;
    memcpy(err->msg + off, old, ol);
    err->msg[off + ol] = '\0';
    if (err->code == FSDP_OK) err->code = FSDP_E_RUNTIME;
    return err->code;
}

void fsdp_err_clear(fsdp_err *err) {
    if (!err) return;
    err->code = FSDP_OK;
    err->msg[0] = '\0';
}

int fsdp_err_exit_code(int code) {
    if (code == FSDP_OK) return 0;
    if (code == FSDP_E_INVALID) return 2;
    return 1;
}

const char *fsdp_err_code_name(int code) {
    switch (code) {
    case FSDP_OK: return "ok";
    case FSDP_E_RUNTIME: return "runtime error";
    case FSDP_E_INVALID: return "invalid input";
    case FSDP_E_IO: return "I/O error";
    case FSDP_E_FORMAT: return "format error";
    case FSDP_E_NOMEM: return "out of memory";
    case FSDP_E_NUMERIC: return "numerical error";
    case FSDP_E_COMM: return "communication error";
    case FSDP_E_DEVICE: return "device error";
    default: return "error";
    }
}
