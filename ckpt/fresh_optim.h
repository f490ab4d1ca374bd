/* The non-tensor entries of a fresh torch.optim.AdamW's state_dict() (module prefix fopt_), as
 * dcp.save({"optimizer": opt.state_dict()}) flattens them: an optimizer that has not stepped has no
 * `state`, so what is left is its one param group,
 *
 *   <prefix>param_groups.0.<option>   for lr, betas, eps, weight_decay, amsgrad, maximize, foreach,
 *                                     capturable, differentiable, fused, decoupled_weight_decay,
 *                                     [initial_lr,] params
 *
 * each a byte item whose pickle holds the value with the Python type torch 2.11 holds: betas a tuple,
 * the booleans False (decoupled_weight_decay True), foreach and fused None, params the list
 * [0, 1, ..., n-1] of the n parameters (a raw state_dict() numbers them), and lr, eps, weight_decay,
 * betas and initial_lr as the number given: an int stays an int (weight_decay 0 is the Python int 0,
 * as AdamW(..., weight_decay=0) holds it), a float a float. initial_lr is there only when given (an LR
 * scheduler sets it: LRScheduler.__init__ puts group["initial_lr"]). The planner_data path of each is
 * (<prefix components>..., "param_groups", 0, <option>), as DCP's flattening records it. Used by
 * save-dcp's fresh_optimizer (Bagel PR #240's step-0 checkpoint of an AdamW that has not stepped). */
#ifndef FSDP_CKPT_FRESH_OPTIM_H
#define FSDP_CKPT_FRESH_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/pickle.h"
#include "fsdp/error.h"

/* A number as the recipe gave it: a Python int or a Python float. */
typedef struct fopt_num {
    int is_int;
    int64_t i;
    double f;
} fopt_num;

typedef struct fopt_adamw {
    const char *prefix; /* before param_groups.0.<option>: "optimizer." ("" or dotted, ending in '.') */
    fopt_num lr, beta1, beta2, eps, weight_decay;
    int has_initial_lr;
    fopt_num initial_lr;
} fopt_adamw;

/* torch 2.11's AdamW defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2 (floats), no
 * initial_lr, prefix "optimizer.". */
void fopt_defaults(fopt_adamw *f);

/* The number of entries fopt_entries emits (12, or 13 with initial_lr). */
size_t fopt_count(const fopt_adamw *f);

/* Receives one entry: its key, its planner_data path (nest / int_mask as dcp_record's) and its
 * pickle opcodes in w (PROTO/STOP left out); it takes them and empties w. */
typedef int (*fopt_add_fn)(void *user, const char *key, int nest, unsigned int_mask, pkl_w *w, fsdp_err *err);

/* The entries of a fresh AdamW over n_params parameters, in the order torch's param group holds
 * its options. */
int fopt_entries(const fopt_adamw *f, size_t n_params, fopt_add_fn add, void *user, fsdp_err *err);

/* The number of dotted components of a prefix ("" 0, "optimizer." 1, "a.b." 2). */
int fopt_prefix_depth(const char *prefix);

#endif
