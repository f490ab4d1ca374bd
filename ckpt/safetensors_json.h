/* A one-pass JSON reader for safetensors headers (module prefix stj_; not a public API).
 *
 * The header is read in place, token by token, with no tree: the caller walks the fixed shape
 * (an object of tensor objects and an optional __metadata__) and asks for the next string,
 * number or structural character. It is as strict as Jansson (RFC 8259): UTF-8 is checked,
 * \u0000 and lone surrogates are refused, control characters must be escaped, numbers follow
 * the JSON grammar and integers must fit in an int64. A value of a shape the caller does not
 * know (an unknown key inside a tensor object) is read and checked by Jansson itself.
 *
 * Decoded strings go to one arena of header-length + 1 bytes: a decoded string (with its NUL) is
 * never longer than its JSON spelling (with its quotes), so the arena cannot overflow. Each
 * error is FSDP_E_FORMAT "<path>: invalid JSON header: <what> (header byte N)". */
#ifndef FSDP_CKPT_SAFETENSORS_JSON_H
#define FSDP_CKPT_SAFETENSORS_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

typedef struct stj {
    const unsigned char *s; /* the header text (not NUL-terminated) */
    size_t n, pos;          /* its length and the cursor */
    const char *path;       /* the file, for messages */
    char *arena;            /* decoded strings, NUL-terminated, n + 1 bytes (malloc'd) */
    size_t used;            /* arena bytes in use; a caller may roll it back to a mark */
} stj;

typedef enum {
    STJ_UINT, /* an integer in [0, INT64_MAX] (-0 included, as Jansson reads it) */
    STJ_NEG,  /* a negative integer in [INT64_MIN, -1] */
    STJ_REAL  /* a number with a fraction or an exponent */
} stj_numkind;

/* A reader over s[0, n) with a fresh arena (the caller owns j->arena: free it). */
int stj_init(stj *j, const unsigned char *s, size_t n, const char *path, fsdp_err *err);

/* Skips whitespace; returns the next byte, or -1 at the end of the header. */
int stj_peek(stj *j);
/* Skips whitespace; an error when the header ends there (a value was expected: truncated). */
int stj_need(stj *j, fsdp_err *err);
/* Skips whitespace and consumes c, else an error "<what> expected". */
int stj_expect(stj *j, char c, const char *what, fsdp_err *err);
/* After a member or an element: consumes ',' (*closed 0) or close (*closed 1), else an error
 * "',' or '<close>' expected <what> '<name>'" (name may be NULL). */
int stj_sep(stj *j, char close, int *closed, const char *what, const char *name, fsdp_err *err);
/* An error at header byte at (FSDP_E_FORMAT, the message as above). */
int stj_fail(const stj *j, size_t at, fsdp_err *err, const char *fmt, ...) FSDP_PRINTF(4, 5);

/* Reads the string at the cursor (after stj_peek returned '"') into the arena; *out points there. */
int stj_string(stj *j, const char **out, fsdp_err *err);
/* Reads the number at the cursor (after stj_peek returned '-' or a digit). *v is the value of a
 * STJ_UINT (0 otherwise). An integer outside int64 is an error. */
int stj_number(stj *j, uint64_t *v, stj_numkind *kind, fsdp_err *err);
/* Reads any JSON value at the cursor, checked by Jansson (duplicate keys refused), and drops it. */
int stj_skip_value(stj *j, fsdp_err *err);

#endif
