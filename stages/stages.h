/* Shared declarations of the built-in stages (one file each in stages/). */
#ifndef FSDP_STAGES_STAGES_H
#define FSDP_STAGES_STAGES_H

#include "fsdp/stage.h"
#include "runtime/comm.h"
#include "runtime/state.h"

/* The context's communicator (a world of 1 when none). */
comm *stage_comm(fsdp_ctx *ctx);
double stage_now(void);

extern const fsdp_stage_desc stage_shard;
extern const fsdp_stage_desc stage_offload;

#endif
