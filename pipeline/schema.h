/* Checks a stage's `with:` map against the parameter schema its descriptor declares and
 * fills in defaults. */
#ifndef FSDP_PIPELINE_SCHEMA_H
#define FSDP_PIPELINE_SCHEMA_H

#include "fsdp/stage.h"
#include "pipeline/value_impl.h"

const char *schema_type_name(fsdp_param_type t);
/* stage_node is the stage's map (for positions); id names the stage in messages. */
int schema_check(const fsdp_stage_desc *d, const char *id, const fsdp_value *stage_node, fsdp_value *with,
                 fsdp_err *err);

/* The same check for any map against a NULL-terminated spec list (e.g. `runtime:`). */
int schema_check_map(const char *label, const fsdp_param_spec *params, const fsdp_value *node_for_missing,
                     fsdp_value *with, fsdp_err *err);

#endif
