/* YAML (libyaml) -> fsdp_value tree with file:line:column marks. */
#ifndef FSDP_PIPELINE_YAML_LOAD_H
#define FSDP_PIPELINE_YAML_LOAD_H

#include <stddef.h>

#include "fsdp/error.h"
#include "pipeline/value_impl.h"

/* Deepest nesting of lists and maps (aliases included: an alias counts its anchor's depth). */
#define YAML_MAX_DEPTH 64

/* Parses a whole YAML file (one document). An empty file gives an empty map. Every value read
 * counts against budget->values (VAL_MAX_VALUES), every value an alias copies against
 * budget->copies (VAL_MAX_COPIES); past either the load stops with an error at the value or alias
 * that crossed it. budget NULL: a fresh budget for this file alone. */
int yaml_load_file(const char *path, val_budget *budget, fsdp_value **out, fsdp_err *err);
/* Parses YAML text (with a fresh budget); `name` is used in error positions and value marks.
 * line/col offsets are added to every mark (for --set values: the column of the value in the
 * argument). */
int yaml_load_string(const char *text, size_t len, const char *name, int line0, int col0,
                     fsdp_value **out, fsdp_err *err);
/* yaml_load_string of one line (line 1, columns offset by col0) that also gives where the value
 * ends: *end is the byte offset just past its last character (0 for an empty document), so a caller
 * can tell whether blanks or a comment after it were dropped. */
int yaml_load_value(const char *text, size_t len, const char *name, int col0, fsdp_value **out, size_t *end,
                    fsdp_err *err);

#endif
