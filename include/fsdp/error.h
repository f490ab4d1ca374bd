/* fsdp-run public API: error reporting.
 *
 * Every function that can fail returns an fsdp error code (0 = success) and fills an
 * fsdp_err with a human-readable message that names the file, key or tensor involved. */
#ifndef FSDP_ERROR_H
#define FSDP_ERROR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FSDP_OK = 0,
    FSDP_E_RUNTIME = 1, /* generic runtime failure                          */
    FSDP_E_INVALID = 2, /* bad usage, invalid recipe or parameter (exit 2 when found before the run: validation, the
                           recipe, a stage's check; a stage that fails while it runs ends the run with exit 1,
                           whatever its code) */
    FSDP_E_IO = 3,      /* a file could not be opened, read or written      */
    FSDP_E_FORMAT = 4,  /* a file is corrupt, truncated or not understood   */
    FSDP_E_NOMEM = 5,   /* out of memory                                    */
    FSDP_E_NUMERIC = 6, /* NaN/Inf or another numerical failure             */
    FSDP_E_COMM = 7,    /* a collective or another rank failed              */
    FSDP_E_DEVICE = 8   /* CUDA / device failure                            */
};

#define FSDP_ERR_MSG_MAX 4096

typedef struct fsdp_err {
    int code;
    char msg[FSDP_ERR_MSG_MAX];
} fsdp_err;

#if defined(__GNUC__)
#define FSDP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FSDP_PRINTF(a, b)
#endif

/* Sets err (when not NULL) to code and the formatted message; returns code. */
int fsdp_err_set(fsdp_err *err, int code, const char *fmt, ...) FSDP_PRINTF(3, 4);
int fsdp_err_setv(fsdp_err *err, int code, const char *fmt, va_list ap);
/* Prepends "prefix: " to the message already in err; returns err->code. */
int fsdp_err_prefix(fsdp_err *err, const char *fmt, ...) FSDP_PRINTF(2, 3);
/* Clears err to FSDP_OK with an empty message. */
void fsdp_err_clear(fsdp_err *err);
/* The process exit code for an error code: 0, 1 (runtime) or 2 (usage/validation). */
int fsdp_err_exit_code(int code);
const char *fsdp_err_code_name(int code);

#ifdef __cplusplus
}
#endif
#endif
