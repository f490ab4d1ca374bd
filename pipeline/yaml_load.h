/* YAML (libyaml) -> fsdp_value tree with file:line:column marks. */
#ifndef FSDP_PIPELINE_YAML_LOAD_H
#define FSDP_PIPELINE_YAML_LOAD_H

#include <stddef.h>

#include "fsdp/error.h"
#include "pipeline/value_impl.h"

/* Parses a whole YAML file (one document). An empty file gives an empty map. */
int yaml_load_file(const char *path, fsdp_value **out, fsdp_err *err);
/* Parses YAML text; `name` is used in error positions and value marks. line/col offsets
 * are added to every mark (for --set values: the column of the value in the argument). */
int yaml_load_string(const char *text, size_t len, const char *name, int line0, int col0,
                     fsdp_value **out, fsdp_err *err);

#endif
