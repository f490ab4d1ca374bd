/* The model table's view of the sharded state (module prefix mt_state_): checks over the state's
 * parameters whose messages name the part of the model (model/model_table.h) each belongs to. The
 * state itself (runtime/state.h) knows nothing of the table. */
#ifndef FSDP_MODEL_MT_STATE_H
#define FSDP_MODEL_MT_STATE_H

#include "fsdp/error.h"
#include "runtime/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FSDP_E_INVALID naming the parameters that hold no value (no_value), for `what` ("save-dcp", ...):
 * the first few by name, with the part each belongs to when the state has a model. 0 when all hold
 * values. The flags are the same on every rank. */
int mt_state_check_values(const fsdp_state *s, const char *what, fsdp_err *err);

#ifdef __cplusplus
}
#endif
#endif
