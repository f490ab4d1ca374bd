/* Internals of the DeepSpeed reader (layouts/lay_deepspeed.c, layouts/lay_deepspeed_map.c). */
#ifndef FSDP_LAYOUTS_LAY_DEEPSPEED_IMPL_H
#define FSDP_LAYOUTS_LAY_DEEPSPEED_IMPL_H

#include <stdint.h>

#include "ckpt/namemap.h"
#include "ckpt/reader_view.h"

typedef struct lay_ds_param {
    char name[512]; /* param_shapes' (Hugging Face) */
    int group;      /* its param group */
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    int64_t numel;
} lay_ds_param;

typedef struct lay_ds {
    const char *path;
    ckpt_reader *u; /* the files (ckpt/reader_union.h): "ms." model states, "r<R>." rank R's optimizer state */
    int ranks, stage;
    lay_ds_param *p;
    size_t n;
    nmap_hf hf;
    ckv_builder *b;
    ckv_piece *pieces; /* scratch */
    size_t n_pieces, cap_pieces;
    size_t *opts;      /* the option entries of param group opts_group (found once per group, not per parameter) */
    size_t n_opts;
    int opts_group;
} lay_ds;

/* Every parameter's weights, moments, step and options, and the train step, into d->b. */
int lay_ds_map(lay_ds *d, fsdp_err *err);

#endif
