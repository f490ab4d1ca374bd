/* Sizes from recipes, validated before anything is allocated: the numeric keys with a natural
 * bound (runtime.threads, model.dim, model.n_layers, data.seq_len against model.max_seq_len and
 * 2^31, data.batch_size, ...), the model (its table, model/mt_spec.h: the section's syntax, names,
 * shapes, dims, init rules, and its parts and their conflicts when the sources exist already; and
 * train-steps only for a model it can train), and the memory the recipe's stages will hold on rank 0
 * (parameters of the model's table, gradients, AdamW moments, training buffers and activations,
 * computed with checked arithmetic) against the host's memory. Each error names the file:line:col of
 * the key. */
#ifndef FSDP_RUN_SIZES_H
#define FSDP_RUN_SIZES_H

#include <stdint.h>

#include "decoder/decoder_config.h"
#include "model/model_table.h"
#include "pipeline/errlist.h"
#include "pipeline/recipe.h"
#include "train/data.h"

#define SIZES_MAX_THREADS 4096       /* runtime.threads: OpenMP threads per rank */
#define SIZES_MAX_DIM (1 << 20)      /* model.dim (the largest released Llama: 16384) */
#define SIZES_MAX_LAYERS (1 << 16)   /* model.n_layers (the largest released Llama: 126) */

/* What the recipe is checked against. */
typedef struct sizes_host {
    uint64_t mem_bytes; /* the host's physical memory; 0: unknown (no memory check) */
    long cores;         /* online CPU cores (for messages) */
    int world;          /* ranks the recipe runs on */
    int ranks_per_node; /* ranks of one node (0: not known) */
    int mesh_r, mesh_s; /* runtime.mesh resolved (0 x 0: no mesh, or shard: auto not known yet) */
    int shard_world;    /* ranks the parameters are sharded over: mesh_s, else world */
    int probe_device;   /* a real run: device auto is resolved here (validate leaves it unknown) */
} sizes_host;

/* Fills h for this machine: physical memory (sysconf), cores, world. */
void sizes_host_probe(sizes_host *h, int world, int probe_device);

/* The model of a chain of recipes: a recipe without a `model:` section trains or loads the model of
 * the last earlier recipe that had one. */
typedef struct sizes_chain {
    decoder_config model;           /* the Llama-family trainer's config (has_llama) */
    int has_llama;
    int trainable;                /* train-steps can train the model */
    int64_t full, shard;          /* parameter elements of the whole model and of rank 0's shard; -1:
                                   * unknown (a source of the table cannot be read yet) */
    char kind[256];               /* the model kind (mt_kind) */
    const fsdp_value *model_node; /* that recipe's model section (error positions), NULL: none yet */
} sizes_chain;

/* Parses and checks runtime.threads, the model and data sections and the memory of r's stages on
 * host h; adds every error found to el. chain carries the model from recipe to recipe. */
void sizes_check(const recipe *r, const sizes_host *h, sizes_chain *chain, errlist *el);

/* For --dry-run: the model as resolved (dims, FFN width, parameter count) and the memory each rank
 * needs (parameters, gradients, optimizer, activations at the recipe's batch), the figures of the
 * memory check, as indented lines into out ("" without a model). Call after sizes_check of r. */
void sizes_describe(const recipe *r, const sizes_host *h, const sizes_chain *chain, char *out, size_t cap);

/* expert_parallel of every train-steps stage against the model's experts and the shard group
 * (run/sizes_train.c): the model has experts, the degree divides the shard group's ranks, which divide
 * the experts. */
void sizes_check_expert_parallel(const recipe *r, const sizes_host *h, const sizes_chain *chain, errlist *el);

/* Gradient accumulation (run/sizes_train.c): every train-steps / eval stage's grad_accum or
 * micro_batch divides the rank's batch of dc (batch_size / world); errors point at the key. */
void sizes_check_micro(const recipe *r, const sizes_host *h, const data_config *dc, errlist *el);
/* The micro-batches per step of a stage's `with` for a rank's batch (1 when invalid). */
int sizes_micro_count(const fsdp_value *with, int64_t local_batch);

/* `transform` stages of r whose target globs (copy.to; scale, fill and cast keys) match no parameter
 * of t, the model r declares (run/sizes_transform.c; called with the table sizes_check builds). */
void sizes_check_transform(const recipe *r, const mt_table *t, errlist *el);

#endif
