/* train-steps' side of the plugin API's hooks (stages/train_hooks.h). */
#include "stages/train_hooks.h"

#include <math.h>

#include "api/api_hooks.h"

static int bridge(void *user, const train_fsdp_result *res, int *skip, double *lr_scale, fsdp_err *err) {
    const train_hooks *h = user;
    fsdp_step_metrics m = {0, h->s->train_step + 1, res->loss, res->grad_norm, h->hp->lr, 0, NAN};
    fsdp_update u;
    int rc = api_pre_update_run(h->ctx, &m, &u, err);
    if (rc) return rc;
    *skip = u.skip;
    *lr_scale = u.lr_scale;
    return 0;
}

void train_hooks_attach(train_hooks *h, fsdp_ctx *ctx, const fsdp_state *s, train_fsdp_hparams *hp) {
    h->ctx = ctx;
    h->s = s;
    h->hp = hp;
    hp->pre_update = api_hooks_count(ctx, FSDP_HOOK_KINDS) ? bridge : NULL;
    hp->pre_user = h;
}

int train_hooks_event(fsdp_ctx *ctx, fsdp_hook_kind k, int64_t step, const char *path, fsdp_err *err) {
    fsdp_hook_event ev = {k, step, path};
    return api_hooks_run(ctx, &ev, err);
}
