/* What the CPU and GPU FSDP steps (train/train_fsdp*.c) share for a model with a mixture of experts
 * (module prefix train_moe_): the auxiliary loss of a micro-batch summed over the ranks, the step's
 * tokens per expert, and the groups of expert parallelism. */
#ifndef FSDP_TRAIN_TRAIN_MOE_H
#define FSDP_TRAIN_TRAIN_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "model/model_blocks.h"
#include "runtime/comm.h"

/* model_blocks' (and model_blocks_cuda's) hooks, the same signatures on both. */
typedef int (*train_moe_stats_fn)(void *ws, double *stats, fsdp_err *err);
typedef int (*train_moe_apply_fn)(void *ws, const double *sums, double scale, model_blocks_aux *out, fsdp_err *err);
typedef int (*train_moe_load_fn)(void *ws, int block, int64_t *counts);

/* The model's auxiliary loss of this micro-batch: its n_aux statistics (into buf) summed over every rank
 * of the step (wc), its gradient set (scaled by 1 / n_micro), its value added to *acc. */
int train_moe_aux(train_moe_stats_fn stats, train_moe_apply_fn apply, void *ws, comm *wc, double *buf, int n_aux,
                  int n_micro, model_blocks_aux *acc, fsdp_err *err);
/* Adds the last forward's tokens per expert of every block to load [n_blocks * E] (first: starts over;
 * a block without experts gets a row of -1). */
void train_moe_load_add(train_moe_load_fn fn, void *ws, int n_blocks, int E, int64_t *load, int first);
/* load [n] summed over wc's ranks (a dense block's -1 row stays -1). */
int train_moe_load_reduce(comm *wc, int64_t *load, size_t n, fsdp_err *err);
/* The groups of expert parallelism `ep` over shard group c (train/train_fsdp_ep.c has the layout): *ep_c
 * (the ranks that exchange tokens) and *edp_c (the ranks whose shards make up one ep rank's experts).
 * has_hook: the model can run expert-parallel. FSDP_E_INVALID naming the numbers when it cannot. */
int train_moe_ep_groups(comm *c, int ep, int n_experts, int has_hook, comm **ep_c, comm **edp_c, fsdp_err *err);

#endif
