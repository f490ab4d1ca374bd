/* The non-tensor entries a DCP checkpoint of fsdp-run carries so that PyTorch resumes the run
 * strictly: torch.optim.AdamW's param_groups flattened per parameter (as
 * torch.distributed.checkpoint.state_dict.get_state_dict(..., flatten_optimizer_state_dict=True)
 * writes them), a LambdaLR's state under lr_scheduler.* and torchtitan's dataloader.* entries.
 * What each key holds and why is in state_resume.c. */
#ifndef FSDP_CKPT_STATE_RESUME_H
#define FSDP_CKPT_STATE_RESUME_H

#include "ckpt/pickle.h"
#include "runtime/state.h"

/* Receives one value: key and its pickle opcodes in w (PROTO/STOP left out); it takes them and
 * empties w. */
typedef int (*sres_add_fn)(void *user, const char *key, pkl_w *w, fsdp_err *err);

/* optimizer.param_groups.<fqn>.<k> of every AdamW key k, for one parameter. */
int sres_param_group(const fsdp_state *s, const char *fqn, sres_add_fn add, void *user, fsdp_err *err);
/* lr_scheduler.* (written once, by rank 0). */
int sres_lr_scheduler(const fsdp_state *s, sres_add_fn add, void *user, fsdp_err *err);
/* dataloader.dp_rank_<rank> (every rank its own) and, on rank 0, dataloader.world_size. */
int sres_dataloader(int rank, int world, sres_add_fn add, void *user, fsdp_err *err);
/* The lr a checkpoint's param_groups hold (the next step's) and the schedule's peak. */
double sres_lr(const fsdp_state *s);
double sres_initial_lr(const fsdp_state *s);

#endif
