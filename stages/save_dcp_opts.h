/* save-dcp's `with:` as sio_save_opts (module prefix sdcp_): prefix, aliases, train_state,
 * fresh_optimizer, files, optimizer, overwrite. Every error points at its value (file:line:col);
 * the stage's check function runs the same parse at validation. */
#ifndef FSDP_STAGES_SAVE_DCP_OPTS_H
#define FSDP_STAGES_SAVE_DCP_OPTS_H

#include "ckpt/state_io.h"
#include "fsdp/value.h"

typedef struct sdcp_opts {
    sio_save_opts o; /* points into the fields below and the recipe's values */
    const char **aliases;
    fopt_adamw fresh;
    sio_side_file *files;
} sdcp_opts;

int sdcp_opts_parse(const fsdp_value *with, sdcp_opts *out, fsdp_err *err);
void sdcp_opts_free(sdcp_opts *o);

#endif
