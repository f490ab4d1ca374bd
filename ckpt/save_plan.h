/* What one rank writes in a DCP save of the state (module prefix splan_): the items of its data
 * file in the order of its records (used by ckpt/state_save.c). Keys (ckpt/state_io.h): parameters
 * under the key prefix and each alias, the optimizer's and torchtitan's entries, a fresh AdamW's
 * param group. */
#ifndef FSDP_CKPT_SAVE_PLAN_H
#define FSDP_CKPT_SAVE_PLAN_H

#include <stddef.h>

#include "ckpt/pickle.h"
#include "ckpt/state_io.h"

/* One item to write: a tensor chunk (data in f32 unless raw), a pickled value, or an alias of an
 * earlier tensor item (no bytes: its record is that item's under another key). */
typedef struct save_item {
    char fqn[512];
    int is_tensor;
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS], offsets[FSDP_MAX_DIMS], sizes[FSDP_MAX_DIMS];
    const float *data;     /* f32 values (converted to dtype when written) */
    int on_dev;            /* data is a device array (downloaded through the staging sink) */
    const state_param *deferred; /* not NULL: data is NULL and the values are this parameter's deferred
                                  * rows (runtime/state_defer.h), pulled into the write buffers */
    unsigned char *value;  /* pickled value opcodes */
    size_t value_len;
    long alias_of;         /* >= 0: the index of the item whose record this one shares */
    int nest;              /* planner_data path (dcp_record.nest / int_mask) */
    unsigned int_mask;
    long param;            /* the parameter it holds (-1: none), for messages */
    int alias;             /* the alias it is written under (-1: the key prefix), for messages */
    int fresh;             /* a fresh_optim entry */
} save_item;

typedef struct save_plan {
    save_item *items;
    size_t n, cap;
    float *snapshot;       /* async: private copy of every buffer */
    unsigned char *values; /* storage of the pickled values */
} save_plan;

/* The items of rank's file in the order of its records: values (rank 0: param groups, scheduler,
 * train_state; every rank: its dataloader entry), its tensor chunks, the aliases of its parameter
 * chunks (alias by alias), then (rank 0) a fresh optimizer's entries. Tensor items point at the
 * state's arrays. */
int splan_build(fsdp_state *s, int rank, int world, const sio_save_opts *o, save_plan *p, fsdp_err *err);
void splan_free(save_plan *p);

/* 1 when p is "" or dotted and ends in '.' (no empty component): "model.", "a.b.". */
int splan_prefix_ok(const char *p);

#endif
