/* A fresh AdamW's param group entries (see fresh_optim.h). The fixture
 * ../shared/fixtures/bagel-056b5fd/expected/pr240_step0_dcp holds the 13 entries torch 2.11 wrote for
 * AdamW(lr=1e-4, betas=(0.9, 0.95), eps=1e-15, weight_decay=0) after a warmup scheduler's first call
 * (lr 0.0, initial_lr 1e-4); tests/test_save_layouts.cc compares with it. */
#include "ckpt/fresh_optim.h"

#include <stdio.h>
#include <string.h>

static fopt_num num_f(double v) {
    fopt_num n = {0, 0, v};
    return n;
}

void fopt_defaults(fopt_adamw *f) {
    memset(f, 0, sizeof *f);
    f->prefix = "optimizer.";
    f->lr = num_f(1e-3);
    f->beta1 = num_f(0.9);
    f->beta2 = num_f(0.999);
    f->eps = num_f(1e-8);
    f->weight_decay = num_f(1e-2);
}

size_t fopt_count(const fopt_adamw *f) { return f->has_initial_lr ? 13 : 12; }

int fopt_prefix_depth(const char *prefix) {
    int n = 0;
    for (const char *p = prefix; p && *p; p++) n += *p == '.';
    return n;
}

static void put_num(pkl_w *w, const fopt_num *n) {
    if (n->is_int) pkl_w_int(w, n->i);
    else pkl_w_float(w, n->f);
}

typedef enum { O_NUM, O_BETAS, O_FALSE, O_TRUE, O_NONE, O_PARAMS } okind;

static void put_option(pkl_w *w, const fopt_adamw *f, okind k, const fopt_num *num, size_t n_params) {
    switch (k) {
    case O_NUM: put_num(w, num); break;
    case O_BETAS:
        put_num(w, &f->beta1);
        put_num(w, &f->beta2);
        pkl_w_tuple_n(w, 2);
        break;
    case O_FALSE: pkl_w_bool(w, 0); break;
    case O_TRUE: pkl_w_bool(w, 1); break;
    case O_NONE: pkl_w_none(w); break;
    case O_PARAMS:
        pkl_w_empty_list(w);
        pkl_w_mark(w);
        for (size_t i = 0; i < n_params; i++) pkl_w_int(w, (int64_t)i);
        pkl_w_appends(w);
        break;
    }
}

int fopt_entries(const fopt_adamw *f, size_t n_params, fopt_add_fn add, void *user, fsdp_err *err) {
    const struct {
        const char *name;
        okind kind;
        const fopt_num *num;
    } opts[] = {{"lr", O_NUM, &f->lr},
                {"betas", O_BETAS, NULL},
                {"eps", O_NUM, &f->eps},
                {"weight_decay", O_NUM, &f->weight_decay},
                {"amsgrad", O_FALSE, NULL},
                {"maximize", O_FALSE, NULL},
                {"foreach", O_NONE, NULL},
                {"capturable", O_FALSE, NULL},
                {"differentiable", O_FALSE, NULL},
                {"fused", O_NONE, NULL},
                {"decoupled_weight_decay", O_TRUE, NULL},
                {"initial_lr", O_NUM, &f->initial_lr},
                {"params", O_PARAMS, NULL}};
    const char *prefix = f->prefix ? f->prefix : "";
    int depth = fopt_prefix_depth(prefix);
    if (depth > 13)
        return fsdp_err_set(err, FSDP_E_INVALID, "fresh_optimizer: prefix '%s' has %d components (at most 13)", prefix,
                            depth);
    pkl_w w;
    pkl_w_init(&w);
    int rc = 0;
    for (size_t k = 0; k < sizeof opts / sizeof *opts && !rc; k++) {
        if (opts[k].num == &f->initial_lr && !f->has_initial_lr) continue;
        char key[1024];
        snprintf(key, sizeof key, "%sparam_groups.0.%s", prefix, opts[k].name);
        put_option(&w, f, opts[k].kind, opts[k].num, n_params);
        if (w.oom) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        /* (<prefix components>..., "param_groups", 0, <option>) */
        if (!rc) rc = add(user, key, depth + 2, 1u << (depth + 1), &w, err);
    }
    pkl_w_free(&w);
    return rc;
}
