/* The classic training checkpoint, torch.save({"model": model.state_dict(), "optimizer":
 * opt.state_dict(), ...}): the optimizer's state is keyed by integer parameter ids (their
 * position in param_groups[*].params, which is the order of model.parameters() when the
 * optimizer was built from it). pt_optim_find maps each id to a name of the model's state dict:
 * the ids, in param-group order, must fall on the model's tensors in the model's order, skipping
 * only buffers; each id's state tensors (exp_avg, ...) must have its parameter's shape. The map is
 * made only when exactly one such assignment exists (the earliest and the latest fit are the
 * same); otherwise the ids stay numbers. */
#ifndef FSDP_CKPT_PT_OPTIM_H
#define FSDP_CKPT_PT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/pickle.h"
#include "fsdp/error.h"

typedef struct pt_optim_map {
    const pkl_obj *optim; /* the optimizer state dict that was mapped, NULL when none */
    size_t n;             /* ids */
    int64_t *ids;         /* param-group order */
    const char **names;   /* names[k] of ids[k] (strings of the pickle) */
    struct idv *by_id;    /* ids sorted, for pt_optim_name */
    char why[256];        /* when optim is NULL but one was found: why its ids were not mapped */
} pt_optim_map;

/* Looks at the top-level dict root for one optimizer state dict ({"state": {int: {...}},
 * "param_groups": [{"params": [int, ...], ...}]}) and one model state dict (a dict of tensors;
 * "model", "model_state_dict" or "state_dict" first, else the only one). */
int pt_optim_find(const pkl_obj *root, pt_optim_map *m, fsdp_err *err);
/* The name of id, NULL when it is not mapped. */
const char *pt_optim_name(const pt_optim_map *m, int64_t id);
void pt_optim_free(pt_optim_map *m);

#endif
