/* The sharded model/optimizer state that stages read and write: every parameter as a
 * local Shard(0) piece with its global metadata, the AdamW moments alongside, the step
 * counter and the data position. Kept in the context under STATE_ATTACH_NAME. */
#ifndef FSDP_RUNTIME_STATE_H
#define FSDP_RUNTIME_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/tensor.h"
#include "model/llama.h"
#include "runtime/comm.h"

#define STATE_ATTACH_NAME "fsdp.state"

typedef enum state_layout {
    STATE_SHARDED = 0, /* each rank holds its Shard(0) rows of every parameter */
    STATE_FULL = 1     /* rank 0 holds every parameter whole; other ranks hold nothing */
} state_layout;

typedef struct state_param {
    char *name;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS]; /* global shape */
    int64_t row_numel;            /* elements per dim-0 row (1 for 1-D; numel for 0-d) */
    int64_t row0, rows;           /* rows held here (global row index of the first) */
    float *data;                  /* rows * row_numel float32 values (master copy) */
    float *grad;                  /* same shape as data, when training */
    float *exp_avg, *exp_avg_sq;  /* AdamW moments, same shape as data, when present */
    int layer;                    /* transformer layer, -1 for others */
    fsdp_dtype dtype;             /* dtype written to checkpoints (values are kept in f32) */
    /* Device copies (runtime.device cuda; from dev_alloc of s->dev): rows * row_numel float32
     * each. Placement rule, per array: at most one of the host pointer (data, grad, exp_avg,
     * exp_avg_sq) and its device twin is non-NULL, and that one holds the values. E.g. on the GPU
     * d_data and d_grad hold the parameter and gradient while data and grad are NULL; after
     * `offload` exp_avg/exp_avg_sq are host (pinned) while d_data stays on the device. */
    float *d_data, *d_grad, *d_exp_avg, *d_exp_avg_sq;
} state_param;

typedef struct fsdp_state {
    state_param *p;
    size_t n;
    state_layout layout;
    int rank, world;
    llama_config cfg;
    int has_cfg;
    int has_optimizer;
    int64_t opt_step;        /* AdamW step count (PyTorch's state['step']) */
    double lr, beta1, beta2, eps, weight_decay; /* hyper-parameters of the last step */
    int64_t train_step;      /* training steps done (train_state.step) */
    int64_t tokens_seen;     /* train_state.ntokens_seen */
    uint64_t data_pos;       /* position of the data stream (batches consumed) */
    int offloaded;           /* optimizer state (and master weights) kept in host memory */
    int offload_params;
    struct dev_ctx *dev;     /* the run's device context when any array is on the GPU (not owned) */
} fsdp_state;

/* The state of the context, or NULL when no stage created one. */
fsdp_state *state_get(fsdp_ctx *ctx);
/* Creates an empty state (replacing any previous one) and attaches it to the context. */
int state_create(fsdp_ctx *ctx, state_layout layout, fsdp_state **out, fsdp_err *err);
void state_free(fsdp_state *s);

/* Adds a parameter of the given global shape; allocates its local rows per the layout
 * (rows filled with zeros). */
int state_add_param(fsdp_state *s, const char *name, int ndim, const int64_t *shape, int layer, fsdp_err *err);
state_param *state_find(fsdp_state *s, const char *name);
size_t state_param_local_numel(const state_param *p);
int64_t state_param_numel(const state_param *p);

/* Allocates (zeroed) AdamW moments for every parameter. */
int state_alloc_optimizer(fsdp_state *s, fsdp_err *err);
/* Allocates (zeroed) gradients for every parameter. */
int state_alloc_grads(fsdp_state *s, fsdp_err *err);

/* STATE_FULL on rank 0 -> STATE_SHARDED on every rank (scatter through the communicator);
 * frees the full copy. Optimizer moments move too when present. */
int state_shard(fsdp_state *s, comm *c, fsdp_err *err);
/* All-gathers parameter p's shards into full (numel floats) on every rank. */
int state_unshard(const state_param *p, const float *local, comm *c, float *full, fsdp_err *err);
/* Reduce-scatter of a full gradient (sum over ranks) into p's local rows. */
int state_reduce_scatter(const state_param *p, const float *full, comm *c, float *local, fsdp_err *err);

#endif
