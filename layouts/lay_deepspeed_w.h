/* Internals of the DeepSpeed writer (layouts/lay_deepspeed_write.c, layouts/lay_deepspeed_wfiles.c). */
#ifndef FSDP_LAYOUTS_LAY_DEEPSPEED_W_H
#define FSDP_LAYOUTS_LAY_DEEPSPEED_W_H

#include <stdint.h>

#include "ckpt/pt_write.h"
#include "layouts/lay_deepspeed.h"

#define LAY_DSW_VERSION "0.19.8" /* the ds_version written: the release checked */

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
    int64_t part;        /* ZeRO-1/2's P: the elements of each rank's partition (the flat vector padded to 2 x world,
                            / world) */
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
/* The model states into dir: ZeRO-1/2's mp_rank_00_model_states.pt, ZeRO-3's zero_pp_rank_<r>_mp_rank_00_... */
int lay_dsw_model_file(lay_dsw *d, const char *dir, int r, fsdp_err *err);
/* ZeRO-3: rank r's optimizer file, each parameter cut into world parts of ceil(n / world) (layouts/lay_deepspeed_w3.c) */
int lay_dsw_optim_file3(lay_dsw *d, const char *dir, int r, fsdp_err *err);

/* Shared by both: elements [e0, e1) of view tensor i (float32, C order) and n zeros into the record being written;
 * the ds_config dict; an object as DeepSpeed pickles its classes, NEWOBJ(cls, ()) + BUILD({key: value}) with
 * kind[k] 0 float, 1 int, 2 bool. */
int lay_dsw_put_elems(lay_dsw *d, ptw_file *t, size_t i, int64_t e0, int64_t e1, fsdp_err *err);
int lay_dsw_put_zeros(ptw_file *t, int64_t n, fsdp_err *err);
void lay_dsw_ds_config(lay_dsw *d, pkl_w *w);
/* Param group g as torch's optimizer state_dict() keeps it (the view's options of group g, then `params`). */
int lay_dsw_group_write(lay_dsw *d, ptw_file *t, size_t g, const int64_t *params, size_t n, fsdp_err *err);
/* loss_scaler (a static scaler of 1), dynamic_loss_scale, overflow: the fp32 entries of every optimizer file. */
void lay_dsw_scaler(pkl_w *w);
/* A file's last entries (ds_config, ds_version), its top dict closed, and the file finished (rc 0) or abandoned
 * (returns rc). */
int lay_dsw_end(lay_dsw *d, ptw_file *t, int rc, fsdp_err *err);
void lay_dsw_object(pkl_w *w, const char *module, const char *cls, const char *const *keys, const double *vals,
                    const int *kind, int n);

#endif
