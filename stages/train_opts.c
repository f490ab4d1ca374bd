/* train-steps' schedule, no_decay and freeze, accumulation and evaluation options (stages/train_opts.h). */
#include "pipeline/errlist.h"
#include "stages/train_opts.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stages/stages.h"

/* The key of `with` an lrs_validate message is about (its text starts with the key's name). */
static const fsdp_value *sched_blame(const fsdp_value *with, const char *msg) {
    static const char *const KEYS[] = {"decay_ratio", "min_lr_factor", "min_lr_ratio", "warmup_steps", "lr", NULL};
    for (const char *const *k = KEYS; *k; k++)
        if (!strncmp(msg, *k, strlen(*k)) && fsdp_value_get(with, *k)) return fsdp_value_get(with, *k);
    if (fsdp_value_get(with, "schedule_steps")) return fsdp_value_get(with, "schedule_steps");
    return fsdp_value_get(with, "steps");
}

int train_sched_from_with(const fsdp_value *with, lrs_config *c, fsdp_err *err) {
    memset(c, 0, sizeof *c);
    int64_t steps = fsdp_arg_int(with, "steps", 0);
    c->lr = fsdp_arg_float(with, "lr", 8e-4);
    c->warmup_steps = fsdp_arg_int(with, "warmup_steps", 0);
    c->steps = fsdp_arg_int(with, "schedule_steps", steps > 0 ? steps : 1);
    c->min_lr_ratio = fsdp_arg_float(with, "min_lr_ratio", 0.1);
    c->decay_ratio = fsdp_arg_float(with, "decay_ratio", -1.0);
    c->min_lr_factor = fsdp_arg_float(with, "min_lr_factor", 0.0);
    const char *decay = fsdp_arg_str(with, "decay", "linear"), *dt = fsdp_arg_str(with, "decay_type", "linear");
    if (lrs_decay_from_name(decay, &c->decay))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "decay"),
                           "train-steps: decay is '%s', expected none, linear, cosine or wsd", decay);
    if (lrs_wsd_type_from_name(dt, &c->decay_type))
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "decay_type"),
                           "train-steps: decay_type is '%s', expected linear, sqrt or cosine", dt);
    if (lrs_validate(c, err)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return fsdp_err_at(err, FSDP_E_INVALID, sched_blame(with, msg), "train-steps: %s", msg);
    }
    return 0;
}

/* wsd's keys only with decay: wsd; min_lr_ratio not with it (wsd's floor is min_lr_factor). */
static int check_wsd_keys(const fsdp_value *with, fsdp_err *err) {
    int wsd = !strcmp(fsdp_arg_str(with, "decay", "linear"), "wsd");
    static const char *const WSD_KEYS[] = {"decay_ratio", "decay_type", "min_lr_factor", NULL};
    errlist el; /* every one of them, each at its place */
    errlist_init(&el);
    for (const char *const *k = WSD_KEYS; *k && !wsd; k++)
        if (fsdp_value_get(with, *k))
            errlist_add_at(&el, fsdp_value_get(with, *k),
                           "train-steps: %s is a key of the wsd schedule (decay: wsd); decay is %s", *k,
                           fsdp_arg_str(with, "decay", "linear"));
    return errlist_finish(&el, err);
}

static int check_positive_in(const fsdp_value *with, const char *stage, const char *key, int64_t min, fsdp_err *err) {
    const fsdp_value *v = fsdp_value_get(with, key);
    if (v && fsdp_arg_int(with, key, min) < min)
        return fsdp_err_at(err, FSDP_E_INVALID, v, "%s: %s is %lld, expected an integer >= %lld", stage, key,
                           (long long)fsdp_arg_int(with, key, min), (long long)min);
    return 0;
}

static int check_positive(const fsdp_value *with, const char *key, int64_t min, fsdp_err *err) {
    return check_positive_in(with, "train-steps", key, min, err);
}

/* A list of globs of parameter names (no_decay, freeze). */
static int check_globs(const fsdp_value *with, const char *key, fsdp_err *err) {
    const fsdp_value *nd = fsdp_value_get(with, key);
    for (size_t i = 0; i < fsdp_value_size(nd); i++) {
        const fsdp_value *g = fsdp_value_item(nd, i);
        if (fsdp_value_type(g) != FSDP_V_SCALAR || !fsdp_value_text(g) || !*fsdp_value_text(g))
            return fsdp_err_at(err, FSDP_E_INVALID, g,
                               "train-steps: %s[%zu]: expected a glob of parameter names (e.g. \"*norm*\")", key, i);
    }
    return 0;
}

static int check_eval(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *ed = fsdp_value_get(with, "eval_data");
    int64_t every = fsdp_arg_int(with, "eval_every", 0);
    if (every > 0 && !ed)
        return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "eval_every"),
                           "train-steps: eval_every needs eval_data (the held-out data: a map like data:, e.g. "
                           "{kind: tokens, path: val.bin})");
    if (!ed) return 0;
    data_config dc;
    /* without its own kind the keys are checked with data:'s when the stage runs */
    int rc = fsdp_value_get(ed, "kind") ? data_config_from_value(ed, 0, &dc, err) : 0;
    if (rc) return fsdp_err_prefix(err, "train-steps: eval_data");
    const fsdp_value *path = fsdp_value_get(ed, "path");
    if (path && fsdp_value_text(path)) {
        FILE *f = fopen(fsdp_value_text(path), "rb");
        if (!f)
            return fsdp_err_at(err, FSDP_E_IO, path, "train-steps: eval_data.path: cannot read %s: %s",
                               fsdp_value_text(path), strerror(errno));
        fclose(f);
    }
    return 0;
}

/* warmup_steps past the schedule's end: reported once, by the recipe checks (run/checks.c, with the
 * stage's id), not again by the schedule's own check. */
static int warmup_past_schedule(const fsdp_value *with) {
    int64_t w = fsdp_arg_int(with, "warmup_steps", 0);
    int64_t len = fsdp_arg_int(with, "schedule_steps", fsdp_arg_int(with, "steps", 0));
    return w > 0 && len > 0 && w > len;
}

int train_opts_check(const fsdp_value *with, fsdp_err *err) {
    int rc = check_wsd_keys(with, err);
    if (!rc) rc = check_positive(with, "schedule_steps", 1, err);
    if (!rc && fsdp_value_get(with, "schedule_steps") &&
        fsdp_arg_int(with, "schedule_steps", 1) < fsdp_arg_int(with, "steps", 0))
        rc = fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "schedule_steps"),
                         "train-steps: schedule_steps %lld is less than steps %lld (the schedule must cover every "
                         "step this stage trains)",
                         (long long)fsdp_arg_int(with, "schedule_steps", 1), (long long)fsdp_arg_int(with, "steps", 0));
    lrs_config c;
    if (!rc && !warmup_past_schedule(with)) rc = train_sched_from_with(with, &c, err);
    if (!rc) rc = check_positive(with, "grad_accum", 1, err);
    if (!rc) rc = check_positive(with, "micro_batch", 1, err);
    if (!rc && fsdp_value_get(with, "grad_accum") && fsdp_value_get(with, "micro_batch"))
        rc = fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_get(with, "micro_batch"),
                         "train-steps: give grad_accum or micro_batch, not both");
    if (!rc) rc = check_positive(with, "eval_every", 0, err);
    if (!rc) rc = check_positive(with, "eval_batches", 1, err);
    if (!rc) rc = check_globs(with, "no_decay", err);
    if (!rc) rc = check_globs(with, "freeze", err);
    if (!rc) rc = check_eval(with, err);
    return rc;
}

int train_glob_mask(const fsdp_value *with, const char *key, const fsdp_state *s, unsigned char **mask,
                    fsdp_err *err) {
    *mask = NULL;
    const fsdp_value *nd = fsdp_value_get(with, key);
    if (!fsdp_value_size(nd)) return 0;
    unsigned char *m = calloc(s->n ? s->n : 1, 1);
    if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (size_t i = 0; i < fsdp_value_size(nd); i++) {
        const char *glob = fsdp_value_text(fsdp_value_item(nd, i));
        size_t hits = 0;
        for (size_t k = 0; glob && k < s->n; k++)
            if (!fnmatch(glob, s->p[k].name, 0)) {
                m[k] = 1;
                hits++;
            }
        if (!hits) {
            free(m);
            return fsdp_err_at(err, FSDP_E_INVALID, fsdp_value_item(nd, i),
                               "train-steps: %s glob '%s' matches no parameter of the model (names like %s)", key,
                               glob ? glob : "", s->n ? s->p[0].name : "tok_embeddings.weight");
        }
    }
    *mask = m;
    return 0;
}

int train_micro_count(const fsdp_value *with, const char *stage, int64_t local_batch, int *n_micro, fsdp_err *err) {
    const fsdp_value *ga = fsdp_value_get(with, "grad_accum"), *mb = fsdp_value_get(with, "micro_batch");
    int64_t n = 1;
    *n_micro = 1;
    if (mb && ga) return fsdp_err_at(err, FSDP_E_INVALID, mb, "%s: give grad_accum or micro_batch, not both", stage);
    if ((mb && check_positive_in(with, stage, "micro_batch", 1, err)) ||
        (ga && check_positive_in(with, stage, "grad_accum", 1, err)))
        return FSDP_E_INVALID;
    if (mb) {
        int64_t rows = fsdp_arg_int(with, "micro_batch", 1);
        if (rows > local_batch || local_batch % rows)
            return fsdp_err_at(err, FSDP_E_INVALID, mb,
                               "%s: micro_batch %lld does not divide this rank's batch of %lld rows "
                               "(data.batch_size over the ranks)",
                               stage, (long long)rows, (long long)local_batch);
        n = local_batch / rows;
    } else if (ga) {
        n = fsdp_arg_int(with, "grad_accum", 1);
        if (n > local_batch || local_batch % n)
            return fsdp_err_at(err, FSDP_E_INVALID, ga,
                               "%s: grad_accum %lld does not divide this rank's batch of %lld rows "
                               "(data.batch_size over the ranks): each micro-batch needs as many rows",
                               stage, (long long)n, (long long)local_batch);
    }
    *n_micro = (int)n;
    return 0;
}

int train_eval_open(fsdp_ctx *ctx, const fsdp_value *eval_data, int vocab, int world, int rank,
                    const data_config *train_dc, data_source **out, fsdp_err *err) {
    data_config dc;
    /* keys eval_data leaves out are the training data's */
    int rc = data_config_over(eval_data, train_dc, &dc, err);
    if (!rc) rc = data_config_model(&dc, fsdp_ctx_section(ctx, "model"), err);
    if (rc) return fsdp_err_prefix(err, "eval_data");
    const char *keys[] = {"batch_size", "seq_len"};
    int64_t want[] = {train_dc->batch_size, train_dc->seq_len}, *got[] = {&dc.batch_size, &dc.seq_len};
    for (int i = 0; i < 2; i++) {
        const fsdp_value *v = fsdp_value_get(eval_data, keys[i]);
        if (v && *got[i] != want[i])
            return fsdp_err_at(err, FSDP_E_INVALID, v,
                               "eval_data.%s is %lld, the training data's is %lld: evaluation runs the training "
                               "batch shape (leave it out)",
                               keys[i], (long long)*got[i], (long long)want[i]);
        *got[i] = want[i];
    }
    rc = data_open(&dc, vocab, world, rank, out, err);
    return rc ? fsdp_err_prefix(err, "eval_data") : 0;
}

int train_eval_loss(train_backend *be, data_source *data, int64_t n_batches, int n_micro, int64_t micro_elems,
                    int32_t *tokens, int32_t *labels, double *loss, int64_t *ntokens, fsdp_err *err) {
    double sum = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < n_batches; b++) {
        int rc = data_batch(data, (uint64_t)b, tokens, labels, err);
        for (int m = 0; m < n_micro && !rc; m++) {
            train_fsdp_result r;
            rc = train_backend_grads(be, tokens + m * micro_elems, labels + m * micro_elems, &r, err);
            /* the global mean back to the global sum; the cross-entropy alone (a mixture of experts' objective
             * adds its load-balancing term, which is no measure of the held-out data) */
            sum += rc ? 0 : r.ce_loss * (double)r.tokens;
            n += rc ? 0 : r.tokens;
        }
        if (rc) return fsdp_err_prefix(err, "evaluation batch %lld", (long long)b + 1);
    }
    *loss = n > 0 ? sum / (double)n : 0.0;
    *ntokens = n;
    return 0;
}
