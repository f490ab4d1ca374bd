/* The resume entries (see state_resume.h), with the values that describe fsdp-run's optimizer.
 *
 * What PyTorch 2.11 expects, read in its source and checked by running it (torch 2.11.0):
 * - torch/optim/adamw.py (AdamW = Adam with decoupled_weight_decay=True) and adam.py: a param
 *   group holds lr, betas, eps, weight_decay, amsgrad, maximize, foreach, capturable,
 *   differentiable, fused, decoupled_weight_decay, and initial_lr once an LR scheduler was made
 *   (torch/optim/lr_scheduler.py: LRScheduler.__init__ sets group["initial_lr"]).
 * - torch/distributed/checkpoint/state_dict.py: _flatten_optim_state_dict writes
 *   param_groups.<fqn>.<key> for every parameter of every group; _unflatten_optim_state_dict reads
 *   param_groups.<first fqn of the group>.<key> for EVERY key of the live optimizer's groups (a
 *   KeyError when one is missing), and a strict dcp.load needs every key of the state dict it
 *   loads into to be in the checkpoint.
 * - LambdaLR.state_dict() in 2.11: base_lrs, last_epoch, _step_count, _is_initial,
 *   _get_lr_called_within_step, _last_lr, lr_lambdas: [None] for a plain function (one DCP byte
 *   item lr_scheduler.lr_lambdas, which a strict load of such a scheduler needs), [{}] for the
 *   functools.partial torchtitan uses (DCP's traversal keeps no leaf of it, so it needs none and
 *   ignores ours; load_state_dict skips a None entry). fsdp-run writes [None].
 * - torchtitan (torchtitan/components/lr_scheduler.py: LRSchedulersContainer.state_dict() is the
 *   first LambdaLR's; components/checkpoint.py: the "lr_scheduler" and "dataloader" entries;
 *   components/dataloader.py ParallelAwareDataloader: {"dp_rank_<r>": pickle.dumps(state),
 *   "world_size": dp world size}).
 *
 * The values: fsdp-run's AdamW is decoupled (AdamW), without amsgrad or maximize, not capturable
 * or differentiable; foreach and fused are None ("PyTorch's default implementation": fsdp-run's
 * update is the same arithmetic, and None never asks a CPU optimizer for a fused kernel). lr is the
 * next step's lr (after N steps a LambdaLR has set the group's lr for step N), initial_lr the
 * schedule's peak; last_epoch = N, _step_count = N + 1, _last_lr = [lr]. The dataloader state is
 * an empty StatefulDataLoader state (pickle of {}): fsdp-run's data position
 * (train_state.data_pos) has no meaning for another data loader, so a torchtitan run resumed from it
 * starts its data loader afresh; world_size is fsdp-run's world size (its data-parallel degree). */
#include <stdio.h>

#include "ckpt/state_resume.h"

double sres_lr(const fsdp_state *s) { return s->has_lr_schedule ? s->lr_next : s->lr; }
double sres_initial_lr(const fsdp_state *s) { return s->has_lr_schedule ? s->lr_initial : s->lr; }

typedef enum { V_FLOAT, V_BOOL, V_NONE, V_BETAS } vkind;

int sres_param_group(const fsdp_state *s, const char *fqn, sres_add_fn add, void *user, fsdp_err *err) {
    const struct {
        const char *k;
        vkind kind;
        double v;
    } keys[] = {{"lr", V_FLOAT, sres_lr(s)},
                {"betas", V_BETAS, 0},
                {"eps", V_FLOAT, s->eps},
                {"weight_decay", V_FLOAT, s->weight_decay},
                {"amsgrad", V_BOOL, 0},
                {"maximize", V_BOOL, 0},
                {"foreach", V_NONE, 0},
                {"capturable", V_BOOL, 0},
                {"differentiable", V_BOOL, 0},
                {"fused", V_NONE, 0},
                {"decoupled_weight_decay", V_BOOL, 1},
                {"initial_lr", V_FLOAT, sres_initial_lr(s)}};
    pkl_w w;
    pkl_w_init(&w);
    char key[1200];
    int rc = 0;
    for (size_t k = 0; k < sizeof keys / sizeof *keys && !rc; k++) {
        snprintf(key, sizeof key, "optimizer.param_groups.%s.%s", fqn, keys[k].k);
        switch (keys[k].kind) {
        case V_FLOAT: pkl_w_float(&w, keys[k].v); break;
        case V_BOOL: pkl_w_bool(&w, keys[k].v != 0); break;
        case V_NONE: pkl_w_none(&w); break;
        case V_BETAS:
            pkl_w_float(&w, s->beta1);
            pkl_w_float(&w, s->beta2);
            pkl_w_tuple_n(&w, 2);
            break;
        }
        rc = add(user, key, &w, err);
    }
    pkl_w_free(&w);
    return rc;
}

static void float_list(pkl_w *w, double v) {
    pkl_w_empty_list(w);
    pkl_w_mark(w);
    pkl_w_float(w, v);
    pkl_w_appends(w);
}

int sres_lr_scheduler(const fsdp_state *s, sres_add_fn add, void *user, fsdp_err *err) {
    pkl_w w;
    pkl_w_init(&w);
    int64_t n = s->train_step;
    float_list(&w, sres_initial_lr(s));
    int rc = add(user, "lr_scheduler.base_lrs", &w, err);
    pkl_w_int(&w, n);
    if (!rc) rc = add(user, "lr_scheduler.last_epoch", &w, err);
    pkl_w_int(&w, n + 1);
    if (!rc) rc = add(user, "lr_scheduler._step_count", &w, err);
    pkl_w_bool(&w, 0);
    if (!rc) rc = add(user, "lr_scheduler._is_initial", &w, err);
    pkl_w_bool(&w, 0);
    if (!rc) rc = add(user, "lr_scheduler._get_lr_called_within_step", &w, err);
    float_list(&w, sres_lr(s));
    if (!rc) rc = add(user, "lr_scheduler._last_lr", &w, err);
    pkl_w_empty_list(&w); /* [None]: a plain lambda's entry (torchtitan's partial, [{}], takes it) */
    pkl_w_mark(&w);
    pkl_w_none(&w);
    pkl_w_appends(&w);
    if (!rc) rc = add(user, "lr_scheduler.lr_lambdas", &w, err);
    pkl_w_free(&w);
    return rc;
}

int sres_dataloader(int rank, int world, sres_add_fn add, void *user, fsdp_err *err) {
    static const unsigned char empty_state[] = {0x80, 0x02, '}', '.'}; /* pickle.dumps({}) */
    pkl_w w;
    pkl_w_init(&w);
    char key[64];
    snprintf(key, sizeof key, "dataloader.dp_rank_%d", rank);
    pkl_w_bytes(&w, empty_state, sizeof empty_state);
    int rc = add(user, key, &w, err);
    if (!rc && rank == 0) {
        pkl_w_int(&w, world);
        rc = add(user, "dataloader.world_size", &w, err);
    }
    pkl_w_free(&w);
    return rc;
}
