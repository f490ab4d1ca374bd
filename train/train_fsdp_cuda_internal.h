/* Private to train/train_fsdp_cuda*.c: the GPU trainer's buffers and events. */
#ifndef FSDP_TRAIN_TRAIN_FSDP_CUDA_INTERNAL_H
#define FSDP_TRAIN_TRAIN_FSDP_CUDA_INTERNAL_H

#include "kernels/cuda/kcu.h"
#include "model/model_blocks.h"
#include "train/train_fsdp_cuda.h"
#include "train/train_fsdp_cuda_event.h"

#include "train/flat_group.h"

/* The most parameters a layer's block holds (model/model_blocks.h). */
#define TRAIN_FSDP_CUDA_LAYER_PARAMS MODEL_BLOCKS_PARAMS_MAX

enum {
    TRAIN_FSDP_CUDA_EV_HEAD_W = 0, /* COMM: embedding, norm, output gathered */
    TRAIN_FSDP_CUDA_EV_HEAD_G,     /* COMPUTE: head gradients written */
    TRAIN_FSDP_CUDA_EV_HEAD_RS,    /* COMM: head gradients reduce-scattered */
    TRAIN_FSDP_CUDA_EV_EMBED_G,    /* COMPUTE: embedding gradient written */
    TRAIN_FSDP_CUDA_EV_EMBED_RS,   /* COMM: embedding gradient reduce-scattered */
    TRAIN_FSDP_CUDA_EV_STATS,      /* COMM: the step's loss and gradient statistics copied to h_stats */
    TRAIN_FSDP_CUDA_EV_COUNT
};

struct train_fsdp_cuda {
    fsdp_state *s;
    comm *c;   /* the shard group (the parameters' Shard(0) rows are over its ranks) */
    comm *wc;  /* every rank of the step (token count): c unless HSDP */
    comm *rep; /* HSDP's replicate group, NULL without replicas */
    dev_ctx *d;
    model_blocks_cuda m;     /* the model (model/model_blocks.h) */
    model_blocks_layout lay; /* its layout: blocks (the layers), embedding, head */
    int B, T;
    train_fsdp_cuda_options opt;
    int world, rank;
    fsdp_dtype dt; /* compute / all-gather dtype */
    size_t es;     /* its size */
    void *ws; /* m's workspace */
    state_param *embed, *norm, *output; /* output NULL with tied embeddings */
    int *first;          /* [n_layers + 1]: layer i's parameters are layer[first[i] .. first[i+1]-1] */
    state_param **layer; /* every layer's parameters in the flat layer order */
    int64_t *off;        /* [first[n_layers]]: each parameter's element offset in its layer's flat buffer */
    int64_t *bnumel;     /* [n_layers]: each layer's flat elements */
    int64_t *acc_at;     /* [n_layers + 1]: where each layer's gradient starts in gacc */
    int64_t layer_numel; /* the largest layer's */
    /* gathered layers: nbuf buffers (2, or n_layers with keep_gathered), what each holds, and
     * events: gather done (COMM), last compute reading it done (COMPUTE) */
    int nbuf;
    void **wbuf;
    int *buf_layer;
    dev_event *g_done, *use_done;
    /* full-layer f32 gradients, two rotating: written (COMPUTE), reduce-scattered (COMM) */
    float *gbuf[2];
    dev_event gl_ready[2], rs_done[2];
    void *full_embed, *full_norm, *full_output;   /* gathered, dtype dt (full_output == full_embed when tied) */
    float *grad_embed, *grad_norm, *grad_output; /* full f32 gradients (grad_output == grad_embed when tied) */
    dev_event ev[TRAIN_FSDP_CUDA_EV_COUNT];
    size_t *blocks;   /* s->n * world: elements of each rank's block of each parameter */
    int64_t *own_off; /* s->n: element offset of this rank's block in the full parameter */
    size_t *bytes;    /* world: scratch for the all-gather sizes */
    kcu_tensor_list *list;
    /* no_decay: the parameters with weight decay and those without (built from the mask at the first
     * step that has one, rebuilt when it changes), NULL when empty */
    kcu_tensor_list *list_wd, *list_nowd;
    unsigned char *split_mask; /* s->n flags the lists were built from */
    /* gradient accumulation: every layer's full f32 gradient (acc_at[n_layers] floats), or NULL */
    float *gacc;
    double *d_stats; /* device [2]: loss sum, gradient sum of squares */
    double *h_stats; /* pinned host copy, valid once EV_STATS completed */
    float *d_clip;   /* device [2]: clip coefficient, non-finite flag (kcu_clip_coef) */
    /* offloaded optimizer: pinned staging [grads | params] of stage_total floats each */
    int offload;
    float *h_stage;
    size_t stage_total;
    size_t *h_off;    /* s->n: offset of each parameter in a half of h_stage */
    dev_event *ev_dl; /* n_layers + 2 download groups: layers, head (n_layers), embedding (+1) */
    size_t dev_bytes;
    /* per-block collectives (train_fsdp_cuda_flat.c): one flat group per layer and the device buffer
     * they take turns in on the COMM stream; unused with opt.per_param */
    flat_group **groups;
    void *flat;
    size_t flat_bytes;
    /* a model with an auxiliary loss (lay.n_aux) and experts (lay.n_experts): the micro-batch's host
     * statistics, the step's loss so far, and the step's tokens per expert ([n_blocks * n_experts], -1
     * rows for dense blocks) */
    double *aux_buf;
    model_blocks_aux aux;
    int64_t *load;
    /* expert parallelism (train_fsdp_cuda_set_expert_parallel; ep 1: off), as the CPU trainer's
     * (train/train_fsdp_ep.c): expert[k] marks the layer parameters whose rows are experts; fmap lists each
     * layer's other parameters (the flat group's, fmap[first[i] + j] = the j-th one's index in layer) */
    int ep;
    unsigned char *expert; /* [first[n_layers]] */
    int *fmap;             /* [first[n_layers]] */
    comm *ep_c, *edp_c;
};

/* Layer parameter k goes through expert parallelism. */
static inline int train_fsdp_cuda_is_ep(const train_fsdp_cuda *f, int k) { return f->ep > 1 && f->expert[k]; }

/* Allocates f->gacc once (train_fsdp_cuda_setup.c). */
int train_fsdp_cuda_alloc_acc(train_fsdp_cuda *f, fsdp_err *err);
/* (Re)builds list_wd / list_nowd from the no_decay flags (one per state parameter). */
int train_fsdp_cuda_split_lists(train_fsdp_cuda *f, const unsigned char *no_decay, fsdp_err *err);

/* Per-block collectives (train_fsdp_cuda_flat.c), all on the COMM stream: the groups and their
 * device buffer; layer `layer`'s all-gather into dst (a gathered-layer buffer of dtype f->dt); its
 * full f32 gradient reduce-scattered into the parameters' d_grad. */
int train_fsdp_cuda_flat_setup(train_fsdp_cuda *f, fsdp_err *err);
void train_fsdp_cuda_flat_free(train_fsdp_cuda *f);
int train_fsdp_cuda_flat_gather(train_fsdp_cuda *f, int layer, void *dst, fsdp_err *err);
int train_fsdp_cuda_flat_reduce(train_fsdp_cuda *f, int layer, const float *grad, fsdp_err *err);

/* Expert parallelism (train_fsdp_cuda_ep.c), on the COMM stream: layer parameter k's ep rank's experts
 * gathered into dst (dtype f->dt) over the edp group; their f32 gradient reduce-scattered over it into
 * d_grad (then over the replicas). */
int train_fsdp_cuda_ep_gather(train_fsdp_cuda *f, int k, void *dst, fsdp_err *err);
int train_fsdp_cuda_ep_reduce(train_fsdp_cuda *f, int k, const float *full, fsdp_err *err);

#endif
