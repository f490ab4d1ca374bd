/* Private to train/train_fsdp*.c: the CPU FSDP step's state, shared by the step (train_fsdp.c) and
 * expert parallelism (train_fsdp_ep.c). */
#ifndef FSDP_TRAIN_TRAIN_FSDP_INTERNAL_H
#define FSDP_TRAIN_TRAIN_FSDP_INTERNAL_H

#include "train/flat_group.h"
#include "train/train_fsdp.h"

struct train_fsdp {
    fsdp_state *s;
    comm *c;   /* the shard group: the parameters' Shard(0) rows are over its ranks */
    comm *wc;  /* every rank of the step (the batch is split over them): c unless HSDP */
    comm *rep; /* HSDP's replicate group (gradients all-reduced over it), NULL without replicas */
    model_blocks m;          /* the model (model/model_blocks.h) */
    model_blocks_layout lay; /* its layout: blocks (the layers), embedding, head */
    int B, T;
    void *ws;                           /* m's workspace */
    state_param *embed, *norm, *output; /* output NULL with tied embeddings */
    int *first;          /* [n_layers + 1]: layer i's parameters are layer[first[i] .. first[i+1]-1] */
    state_param **layer; /* every layer's parameters, in the flat layer order */
    int64_t *off;        /* [first[n_layers]]: each parameter's offset in its layer's flat buffer */
    int64_t *numel;      /* [n_layers]: each layer's flat elements */
    int64_t *acc_at;     /* [n_layers]: where each layer's gradient starts in acc */
    int64_t layer_numel; /* the largest layer's */
    float *full_layer, *grad_layer; /* one gathered layer and its gradient */
    double *aux_buf;     /* [lay.n_aux]: the auxiliary loss's statistics of a micro-batch */
    int64_t *load;       /* [n_blocks * lay.n_experts]: the step's tokens per expert (-1: a dense block) */
    float *full_embed, *full_norm, *full_output; /* full_output == full_embed when tied */
    float *grad_embed, *grad_norm, *grad_output; /* grad_output == grad_embed when tied */
    float *acc; /* gradient accumulation: every layer's full gradient (n_layers x layer_numel), or NULL */
    /* per-block collectives (train/flat_group.h): one group per layer, its scratch (the largest
     * group's); per_param: one all-gather / reduce-scatter per parameter instead (train_fsdp_set_flat) */
    flat_group **groups;
    float *flat_scratch;
    size_t scratch_numel;
    int per_param;
    /* expert parallelism (train_fsdp_set_expert_parallel; ep 1: off): expert[k] marks the parameters whose
     * rows are experts; ep_c holds the ep ranks that own the experts a token may go to, edp_c the ranks
     * whose shards make up one ep rank's experts */
    int ep;
    unsigned char *expert; /* [first[n_layers]] */
    comm *ep_c, *edp_c;
};

/* Layer i's parameter k (an index into f->layer) is handled by expert parallelism. */
static inline int train_fsdp_is_ep(const train_fsdp *f, int k) { return f->ep > 1 && f->expert[k]; }
/* One flat group per layer over the parameters that are not expert-parallel, and the scratch they share. */
int train_fsdp_make_groups(train_fsdp *f, int world, int rank, fsdp_err *err);
/* The expert-parallel parameter k: its ep rank's experts gathered into full (the rows of this rank's
 * edp group), or their gradient (summed over the edp group, then the replicas) into p->grad. */
int train_fsdp_ep_gather(train_fsdp *f, int k, float *full, fsdp_err *err);
int train_fsdp_ep_reduce(train_fsdp *f, int k, const float *full, fsdp_err *err);

#endif
