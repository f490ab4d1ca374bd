/* fsdp-run public API: read-only access to recipe values (the parsed YAML tree).
 *
 * A stage's `with:` map arrives as an fsdp_value of kind FSDP_V_MAP whose entries have
 * been checked against the stage's parameter schema, with defaults filled in and
 * ${var} references substituted. Every value remembers the file, line and column it
 * came from, so that errors can point at it (fsdp_err_at). */
#ifndef FSDP_VALUE_H
#define FSDP_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_value fsdp_value;

typedef enum fsdp_value_kind {
    FSDP_V_NULL = 0, /* `~`, `null` or an empty value */
    FSDP_V_SCALAR,   /* any scalar: its text is kept; typed accessors parse it */
    FSDP_V_LIST,
    FSDP_V_MAP
} fsdp_value_kind;

fsdp_value_kind fsdp_value_type(const fsdp_value *v); /* FSDP_V_NULL for NULL */
const char *fsdp_value_text(const fsdp_value *v);     /* scalar text, else NULL */
/* 1 when v is a scalar written quoted in YAML ('0', "true": a string whatever its text), else 0. */
int fsdp_value_quoted(const fsdp_value *v);
size_t fsdp_value_size(const fsdp_value *v);          /* list/map entries, else 0 */
const fsdp_value *fsdp_value_item(const fsdp_value *v, size_t i);
const char *fsdp_value_key(const fsdp_value *map, size_t i);
const fsdp_value *fsdp_value_get(const fsdp_value *map, const char *key);
/* Dotted path lookup through maps: "optimizer.betas". */
const fsdp_value *fsdp_value_path(const fsdp_value *root, const char *dotted);

/* Typed views of a scalar: return 0 on success, -1 when the text is not of that type. */
int fsdp_value_int(const fsdp_value *v, int64_t *out);
int fsdp_value_float(const fsdp_value *v, double *out);
int fsdp_value_bool(const fsdp_value *v, int *out);

/* Where the value came from ("recipe.yaml", 12, 5); "--set" for command-line overrides. */
void fsdp_value_where(const fsdp_value *v, const char **file, int *line, int *col);

/* Sets err to "file:line:col: <message>" for value v; returns code. */
int fsdp_err_at(fsdp_err *err, int code, const fsdp_value *v, const char *fmt, ...) FSDP_PRINTF(4, 5);

/* Convenience accessors for a stage's `with:` map; dflt when the key is absent/null. */
const char *fsdp_arg_str(const fsdp_value *with, const char *key, const char *dflt);
int64_t fsdp_arg_int(const fsdp_value *with, const char *key, int64_t dflt);
double fsdp_arg_float(const fsdp_value *with, const char *key, double dflt);
int fsdp_arg_bool(const fsdp_value *with, const char *key, int dflt);

#ifdef __cplusplus
}
#endif
#endif
