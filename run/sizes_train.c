/* Validate-time checks of gradient accumulation against the data and the world size
 * (run/sizes.h): grad_accum / micro_batch of train-steps and eval must divide each rank's
 * batch, known before anything runs; and expert_parallel against the model and the shard group. */
#include <stdio.h>
#include <string.h>

#include "run/sizes.h"
#include "stages/train_opts.h"

int sizes_micro_count(const fsdp_value *with, int64_t local_batch) {
    int n = 1;
    fsdp_err e;
    if (local_batch < 1 || train_micro_count(with, "train-steps", local_batch, &n, &e)) return 1;
    return n;
}

void sizes_check_micro(const recipe *r, const sizes_host *h, const data_config *dc, errlist *el) {
    if (!dc || h->world < 1 || dc->batch_size % h->world) return; /* reported with data.batch_size */
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        if (strcmp(s->uses, "train-steps") && strcmp(s->uses, "eval")) continue;
        const fsdp_value *ga = fsdp_value_get(s->with, "grad_accum"), *mb = fsdp_value_get(s->with, "micro_batch");
        if ((ga && mb) || (ga && fsdp_arg_int(s->with, "grad_accum", 1) < 1) ||
            (mb && fsdp_arg_int(s->with, "micro_batch", 1) < 1))
            continue; /* the stage's own check reports those */
        int n;
        fsdp_err e;
        fsdp_err_clear(&e);
        if (train_micro_count(s->with, s->uses, dc->batch_size / h->world, &n, &e)) errlist_add(el, &e);
    }
}

void sizes_check_expert_parallel(const recipe *r, const sizes_host *h, const sizes_chain *chain, errlist *el) {
    const int S = h->shard_world > 0 ? h->shard_world : h->world;
    const int E = chain->has_llama ? chain->model.n_experts : 0;
    for (size_t i = 0; i < r->n_stages; i++) {
        const recipe_stage *s = &r->stages[i];
        const fsdp_value *v = fsdp_value_get(s->with, "expert_parallel");
        if (strcmp(s->uses, "train-steps") || !v) continue;
        const int64_t P = fsdp_arg_int(s->with, "expert_parallel", 1);
        if (P <= 1) continue; /* < 1 is the stage's own check */
        if (!chain->has_llama) continue; /* a model train-steps cannot train is reported elsewhere */
        if (!E)
            errlist_add_at(el, v, "stage '%s' (train-steps): expert_parallel %lld, but the model has no experts", s->id,
                           (long long)P);
        else if (S % P || E % S)
            errlist_add_at(el, v, "stage '%s' (train-steps): expert_parallel %lld needs a shard group whose size (%d "
                           "ranks) it divides and that divides the %d experts (each rank holds whole experts)", s->id,
                           (long long)P, S, E);
    }
}
