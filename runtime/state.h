/* The sharded model/optimizer state that stages read and write: every parameter as a
 * local Shard(0) piece with its global metadata, the AdamW moments alongside, the step
 * counter and the data position. Kept in the context under STATE_ATTACH_NAME. */
#ifndef FSDP_RUNTIME_STATE_H
#define FSDP_RUNTIME_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/ctx.h"
#include "fsdp/tensor.h"
#include "runtime/comm.h"
#include "runtime/name_index.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STATE_ATTACH_NAME "fsdp.state"

struct mt_table; /* model/model_table.h: the state does not look inside it */

/* How a mixture-of-experts model names its experts and router in Hugging Face checkpoints (the state
 * holds them grouped, torchtitan's layers.{i}.moe.experts.w{1,2,3} [E, ...]: ckpt/namemap.h). */
typedef enum state_hf_moe {
    STATE_HF_MOE_NONE = 0,   /* no experts */
    STATE_HF_MOE_MLP = 1,    /* mlp.experts.{e}.{gate,up,down}_proj.weight, router mlp.gate.weight
                                (Qwen3-MoE, OLMoE, DeepSeek-V3) */
    STATE_HF_MOE_MIXTRAL = 2 /* block_sparse_moe.experts.{e}.{w1,w3,w2}.weight, router
                                block_sparse_moe.gate.weight (Mixtral) */
} state_hf_moe;

/* What the Hugging Face name mapping (ckpt/namemap.h) needs of a trainable decoder: its head counts
 * (the q/k rows are permuted per head) and whether the head is tied to the embedding. */
typedef struct state_hf_names {
    int has; /* 0: the model has no built-in trainer (names map without permutation facts) */
    int n_heads, n_kv_heads, tied;
} state_hf_names;

/* The rest of what the mapping needs of a decoder, beside state_hf_names (set with it, by
 * decoder_state_set_config; kept apart so that state_hf_names' positional initialisers stay whole):
 * whether the q/k norms span the whole projection and how the experts are named. */
typedef struct state_hf_moe_names {
    int qk_norm_full; /* 1: q_norm / k_norm weights span the whole q / k projection (OLMoE): their rows
                         move like q rows (n_heads heads) and k rows (n_kv_heads heads) */
    int moe_style;    /* state_hf_moe */
} state_hf_moe_names;

typedef enum state_layout {
    STATE_SHARDED = 0, /* each rank holds its Shard(0) rows of every parameter */
    STATE_FULL = 1     /* rank 0 holds every parameter whole; other ranks hold nothing */
} state_layout;

/* The arrays of a parameter (placement-aware code names them with this). */
typedef enum state_array { STATE_DATA = 0, STATE_GRAD, STATE_EXP_AVG, STATE_EXP_AVG_SQ, STATE_ARRAYS } state_array;

/* Where one array of a parameter lives. */
typedef enum state_place {
    STATE_ABSENT = 0, /* not allocated (no gradient, no optimizer state yet) */
    STATE_HOST,       /* host pointer, malloc'd */
    STATE_PINNED,     /* host pointer, pinned memory from s->dev (dev_host_alloc) */
    STATE_DEVICE      /* device twin (dev_alloc of s->dev) */
} state_place;

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
    unsigned pinned; /* bit (1u << state_array): that host array is pinned memory of s->dev */
    /* 1 while the parameter holds no value: declared with init rule none (or for a load) and not yet
     * loaded, copied or filled. Its rows then hold NaN; the stages that read values (save-dcp,
     * save-safetensors, verify, transform's sources, train-steps) refuse it, naming it. */
    int no_value;
    /* 1: declared trainable: false (a model table's part or parameter, fsdp_param_set_trainable): saved,
     * loaded, resharded and exported like the others, never trained, never given moments. */
    int buffer;
    /* 1: not trained by the running train-steps (buffer, or matched by its freeze: globs; set and
     * cleared by train-steps). A trainer gives such a parameter no update, no weight decay and no new
     * moments, and leaves its gradient out of the norm and the clipping (PyTorch's requires_grad=False). */
    int frozen;
    /* 1: the data array is deferred (runtime/state_defer.h): data is NULL and no rows are held; the values
     * are produced on demand by src (rows of an init stream, of a checkpoint, ...), rounded to src_round
     * (bf16 / f16; 0: none), or are NaN when src is NULL (no_value). state_place_of says STATE_HOST. */
    int deferred;
    struct state_src *src;
    fsdp_dtype src_round;
} state_param;

/* 1 when p has AdamW moments (a parameter the optimizer holds); defined in runtime/state_dev.c. */
int state_param_has_moments(const state_param *p);
/* 1 when the trainers update p (neither a buffer nor frozen). */
static inline int state_param_trained(const state_param *p) { return !p->buffer && !p->frozen; }

typedef struct fsdp_state {
    state_param *p;
    size_t n;
    size_t cap;  /* entries allocated in p (state_add_param grows it geometrically) */
    nidx names;  /* name -> index in p of every parameter (state_add_param keeps it; a zeroed
                  * state is an empty one, and state_free frees it) */
    state_layout layout;
    int rank, world;
    /* The model's description (model/model_table.h): every parameter's declared shape, dtype, init
     * rule and part, in the order of p (owned, freed by state_free through model_free; NULL for states
     * built without one). */
    struct mt_table *model;
    void (*model_free)(struct mt_table *model);
    /* The built-in trainer's config when the model has one (decoder/: a decoder_config, read with
     * decoder_state_config and set with decoder_state_set_config), owned (free()); NULL otherwise. */
    void *trainer_cfg;
    state_hf_names hf; /* set with trainer_cfg */
    state_hf_moe_names hf_moe; /* set with hf */
    int has_optimizer;
    int64_t opt_step;        /* AdamW step count (PyTorch's state['step']) */
    double lr, beta1, beta2, eps, weight_decay; /* hyper-parameters of the last step */
    /* The LR schedule as PyTorch's optimizer and LambdaLR hold it after the last step (written to
     * checkpoints as param_groups' initial_lr / lr and lr_scheduler.*): the schedule's peak lr and
     * the lr of the next step; has_lr_schedule 0 when no train-steps or checkpoint set them. */
    double lr_initial, lr_next;
    int has_lr_schedule;
    /* fsdp_optim_set_lr (include/fsdp/params.h): train-steps multiplies its schedule by this from the
     * next step on (0: not set, 1) */
    double lr_scale;
    int64_t train_step;      /* training steps done (train_state.step) */
    int64_t tokens_seen;     /* train_state.ntokens_seen */
    uint64_t data_pos;       /* position of the data stream (batches consumed) */
    int offloaded;           /* optimizer state (and master weights) kept in host memory */
    int offload_params;
    /* The run's device context while any array is on the GPU or in its pinned memory (not owned:
     * the state must be freed before the device context). With `offloaded`, the AdamW moments
     * (and with `offload_params` the master weights and gradients) stay in pinned host memory
     * while the rest is on the GPU: the optimizer step for those runs on the host (CPU AdamW). */
    struct dev_ctx *dev;
    /* Plugins' named bytes (include/fsdp/ckpt.h's fsdp_plugin_state_*): saved as plugin_state.<key> in
     * every checkpoint in fsdp-run's layout, read back by a load of one (state_blob_set / _get). */
    struct state_blob *blobs;
    size_t n_blobs;
} fsdp_state;

typedef struct state_blob {
    char *key;
    unsigned char *data;
    size_t n;
} state_blob;

/* Sets (n 0: removes) the bytes under key; state_blob_get: NULL when there are none. */
int state_blob_set(fsdp_state *s, const char *key, const void *data, size_t n, fsdp_err *err);
const state_blob *state_blob_get(const fsdp_state *s, const char *key);

/* The state of the context, or NULL when no stage created one. */
fsdp_state *state_get(fsdp_ctx *ctx);
/* Creates an empty state (replacing any previous one) and attaches it to the context. */
int state_create(fsdp_ctx *ctx, state_layout layout, fsdp_state **out, fsdp_err *err);
/* Frees every array wherever it lives (device twins and pinned arrays through s->dev). */
void state_free(fsdp_state *s);

/* Adds a parameter of the given global shape; allocates its local rows per the layout
 * (rows filled with zeros). Amortised O(log n) for n parameters (a name seen twice is an error).
 * Pointers into s->p are invalidated by the next state_add_param. */
int state_add_param(fsdp_state *s, const char *name, int ndim, const int64_t *shape, int layer, fsdp_err *err);
/* The parameter of that name, or NULL: O(log n) (through s->names). */
state_param *state_find(fsdp_state *s, const char *name);
size_t state_param_local_numel(const state_param *p);
int64_t state_param_numel(const state_param *p);

/* Allocates (zeroed) AdamW moments for every trained parameter (state_param_trained) that has none: a
 * buffer or a frozen one gets none (it keeps moments it had, unchanged); on the device when the
 * parameter's data is there, in pinned host memory when the state is `offloaded` and has a device,
 * else in host memory. */
int state_alloc_optimizer(fsdp_state *s, fsdp_err *err);
/* Allocates (zeroed) gradients for every parameter that has none, next to its data (pinned host
 * memory when the data is on the host of a state with a device). */
int state_alloc_grads(fsdp_state *s, fsdp_err *err);


/* Parameter p's dim 0 becomes d0 (runtime/state_resize.c): its rows become those of the layout for d0,
 * and each array it had (data always; the moments when present) holds this rank's rows of full[a]
 * (d0 x row_numel floats on the host: the new whole tensor; NULL: zeros), in the place it was (device
 * arrays uploaded). Gradients are dropped. */
int state_param_set_rows(fsdp_state *s, state_param *p, int64_t d0, const float *const *full, fsdp_err *err);
/* Removes parameter i and its arrays; the ones after it move down by one. */
int state_remove_param(fsdp_state *s, size_t i, fsdp_err *err);

/* STATE_FULL on rank 0 -> STATE_SHARDED on every rank (scatter through the communicator);
 * frees the full copy. Optimizer moments move too when present. The full state must be in host
 * memory (FSDP_E_INVALID otherwise). */
int state_shard(fsdp_state *s, comm *c, fsdp_err *err);
/* All-gathers parameter p's shards into full (numel floats) on every rank. */
int state_unshard(const state_param *p, const float *local, comm *c, float *full, fsdp_err *err);
/* Reduce-scatter of a full gradient (sum over ranks) into p's local rows. */
int state_reduce_scatter(const state_param *p, const float *full, comm *c, float *local, fsdp_err *err);

/* ---- placement (runtime/state_dev.c) ----------------------------------------------------------
 * Every array of every parameter is in one place (state_place). Host code reads and writes any
 * array through state_param_get / state_param_put / state_param_map; stages move whole states with
 * state_to_device / state_to_host. Everything here works for host-only states in every build;
 * what needs a GPU fails with FSDP_E_DEVICE (in a build without CUDA: "built without CUDA"). */

const char *state_array_name(state_array a); /* "data", "grad", "exp_avg", "exp_avg_sq" */
state_place state_place_of(const state_param *p, state_array a);
/* The host pointer / device twin slot of array a. */
float **state_param_host_slot(state_param *p, state_array a);
float **state_param_dev_slot(state_param *p, state_array a);
/* Any array of any parameter on the device (STATE_DEVICE). */
int state_on_device(const fsdp_state *s);

/* Frees array a of p wherever it lives (no-op when absent). */
void state_param_release(fsdp_state *s, state_param *p, state_array a);
/* Gives array a of p new storage at `where` (STATE_HOST, STATE_PINNED or STATE_DEVICE; the last
 * two need s->dev), zero-filled when `zero`, else uninitialised; any previous array a is freed
 * without copying. */
int state_param_alloc(fsdp_state *s, state_param *p, state_array a, state_place where, int zero, fsdp_err *err);
/* Moves array a of p to `where`, keeping its values (no-op when absent or already there). */
int state_param_move(fsdp_state *s, state_param *p, state_array a, state_place where, fsdp_err *err);

/* Sets the state's device context (FSDP_E_INVALID when it already has a different one). */
int state_attach_device(fsdp_state *s, struct dev_ctx *d, fsdp_err *err);
/* Uploads every array of every parameter to d, pipelined through pinned staging, and frees the host
 * copies - except the arrays `offload` keeps on the host (s->offloaded: exp_avg / exp_avg_sq;
 * s->offload_params: data / grad too), which move to pinned host memory of d instead. */
int state_to_device(fsdp_state *s, struct dev_ctx *d, fsdp_err *err);
/* Where state_to_device puts array a: STATE_PINNED for the arrays `offload` keeps on the host,
 * else STATE_DEVICE. */
state_place state_device_target(const fsdp_state *s, state_array a);
/* Downloads every device array into (pageable) host memory and frees the device copies; pinned
 * arrays stay where they are. s->dev is cleared when nothing uses the device any more. */
int state_to_host(fsdp_state *s, fsdp_err *err);

/* Parameter p's local rows of array a (state_param_local_numel floats), synchronously, wherever
 * they live (device arrays through pinned staging in chunks). FSDP_E_INVALID when absent. */
int state_param_get(const fsdp_state *s, const state_param *p, state_array a, float *host_dst, fsdp_err *err);
int state_param_put(fsdp_state *s, state_param *p, state_array a, const float *host_src, fsdp_err *err);
/* Host access to array a of p: *host is the host array itself, or a malloc'd download of the device
 * array. state_param_unmap uploads a download back when write_back and frees it; host arrays are
 * left alone (changes through *host are already in place). */
int state_param_map(const fsdp_state *s, const state_param *p, state_array a, float **host, fsdp_err *err);
int state_param_unmap(fsdp_state *s, state_param *p, state_array a, float *host, int write_back, fsdp_err *err);

/* A read-only host copy of s for code that reads host arrays (checkpoint writers): the same
 * metadata; host and pinned arrays are shared, device arrays downloaded. The view's arrays must not
 * be freed or resized; free it with state_host_view_free before changing s. */
int state_host_view(const fsdp_state *s, fsdp_state **view, fsdp_err *err);
void state_host_view_free(fsdp_state *view);

#ifdef __cplusplus
}
#endif
#endif
