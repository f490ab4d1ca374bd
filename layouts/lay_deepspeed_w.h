/* Internals of the DeepSpeed writer (layouts/lay_deepspeed_write.c, layouts/lay_deepspeed_wfiles.c). */
#ifndef FSDP_LAYOUTS_LAY_DEEPSPEED_W_H
#define FSDP_LAYOUTS_LAY_DEEPSPEED_W_H

#include <stdint.h>

#include "layouts/lay_deepspeed.h"

typedef struct lay_dsw_param {
    size_t w;          /* the view's entry of its weight (HF name) */
    long m1, m2, st;   /* of its exp_avg, exp_avg_sq, step */
    int64_t numel;
    int group;         /* its param group + 1 (0: none yet) */
    int64_t off;       /* where it starts in its group's flat vector */
} lay_dsw_param;

typedef struct lay_dsw_group {
    size_t params_entry; /* the view's entry of its params list */
    long *ids;           /* its parameters (ids: indices of lay_dsw.p), in module order */
    size_t n;
    int64_t total;       /* elements of its parameters */
    int64_t part;        /* P: the elements of each rank's partition (the flat vector padded to 2 x world, / world) */
} lay_dsw_group;

typedef struct lay_dsw {
    const lay_ds_wopts *o;
    ckpt_reader *canon, *v; /* fsdp-run's checkpoint; the view of it in ds_row */
    lay_dsw_param *p;       /* in module order: p[k] is id k */
    size_t np;
    lay_dsw_group *g;
    size_t ng;
    int64_t step;           /* global_steps */
    float *buf;             /* scratch for element ranges */
    size_t buf_cap;
    size_t written;         /* tensors written */
    uint64_t bytes;         /* and their bytes */
} lay_dsw;

/* The optimizer step of every parameter (equal) and global_steps (train_state.step, else that step). */
int lay_dsw_step(lay_dsw *d, fsdp_err *err);
/* Rank r's zero_pp_rank_<r>_mp_rank_00_optim_states.pt into dir. */
int lay_dsw_optim_file(lay_dsw *d, const char *dir, int r, fsdp_err *err);
/* mp_rank_00_model_states.pt into dir. */
int lay_dsw_model_file(lay_dsw *d, const char *dir, fsdp_err *err);

#endif
