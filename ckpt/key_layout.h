/* Key layouts of training checkpoints: where the model's parameters and the optimizer's state sit
 * among a checkpoint's keys.
 *
 *   torchtitan          parameters at the top level, optimizer.state.<fqn>.<kind>,
 *                       optimizer.param_groups.<fqn>.<option> (what fsdp-run writes)
 *   {"model", "optim"}  model.<fqn>, optim.state.<fqn>.<kind>, optim.param_groups.<fqn>.<option>
 *                       (dcp.save({"model": ..., "optim": ...}) of get_state_dict's two dicts)
 *   the DCP tutorial    app.model.<fqn>, app.optim.state.<fqn>.<kind>, ... (its
 *                       dcp.save({"app": AppState(model, optimizer)}), AppState returning
 *                       {"model": ..., "optim": ...} from get_state_dict)
 *
 * A layout is two prefixes: `model` (before every parameter name) and `optim` (before state. and
 * param_groups.). Either can be given explicitly (load-ckpt's `prefixes:`, convert's --prefixes);
 * what is not given is detected from the keys. */
#ifndef FSDP_CKPT_KEY_LAYOUT_H
#define FSDP_CKPT_KEY_LAYOUT_H

#include <stddef.h>

#include "ckpt/reader.h"
#include "fsdp/error.h"

#define CKL_PREFIX_CAP 128

typedef struct ckl_layout {
    char model[CKL_PREFIX_CAP]; /* "" for top-level parameters */
    char optim[CKL_PREFIX_CAP]; /* "optimizer." (torchtitan), "optim.", "app.optim.", ... */
    int model_given, optim_given; /* set explicitly rather than detected */
} ckl_layout;

/* Checks one explicit prefix ("" or a dotted name ending in '.', no '*', at most CKL_PREFIX_CAP-1
 * bytes); what names the option for the message. */
int ckl_prefix_check(const char *what, const char *prefix, fsdp_err *err);

/* The layout of r's keys. model / optim: explicit prefixes or NULL to detect them. The optimizer
 * prefix detected is the part of an optimizer-state key before its `state.` component (a tensor key
 * <P>state.<fqn>.<kind> of an AdamW / SGD moment); two different ones are an error naming a key of
 * each. The model prefix detected is the one beside it (P with its last component `optim` /
 * `optimizer` replaced by `model`: app.optim. -> app.model.), else "model." (the caller checks that
 * it names parameters, see sio_load_opts.detect_prefix). */
int ckl_detect(ckpt_reader *r, const char *model, const char *optim, ckl_layout *out, fsdp_err *err);

/* 1 when name is a training entry (optimizer state / param groups under the layout's optim prefix,
 * train_state.*, lr_scheduler.*, dataloader.*, also under the model prefix's parent), else 0. */
int ckl_is_training(const ckl_layout *l, const char *name);

/* 1 when the tensor key names an optimizer moment (its last component is exp_avg, exp_avg_sq,
 * max_exp_avg_sq or momentum_buffer). */
int ckl_is_moment(const char *name);

/* The optimizer moments of r that this layout cannot map onto a parameter: a moment key not of the
 * form <optim>state.<fqn>.<kind> (into bad), or whose <fqn> has_param (may be NULL: any; it is given the fqn and
 * the whole key) does not know (into unknown: moments of tensors the model does not declare). Appends "\n  KEY"
 * for each to its buffer (cap bytes each, truncated with "..."); *n_bad and *n_unknown count them, *n_known the
 * moments has_param knows. */
void ckl_unmapped_moments(ckpt_reader *r, const ckl_layout *l, int (*has_param)(void *, const char *, const char *),
                          void *user, char *bad, char *unknown, size_t cap, size_t *n_bad, size_t *n_unknown,
                          size_t *n_known);

/* name rewritten into torchtitan's layout (model prefix removed, optim prefix -> "optimizer."); a
 * name under neither prefix is copied as it is. Returns 0, or FSDP_E_INVALID when out is too small. */
int ckl_to_torchtitan(const ckl_layout *l, const char *name, char *out, size_t cap, fsdp_err *err);

#endif
