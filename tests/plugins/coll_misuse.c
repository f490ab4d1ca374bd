/* Test plugin of the plugin API's agreed collectives (api/api_agree.h): stage `coll-misuse` makes one
 * mistake a plugin makes with collectives across ranks, chosen by `case`, in the stage body or (with
 * callback: true) in a train-steps callback at optimizer step 1:
 *   rank0-only   only rank 0 calls fsdp_allreduce (a call under `if (rank == 0)`)
 *   rank0-again  the same, then rank 0 calls fsdp_barrier anyway (the channel broke: it fails at once)
 *   not-rank0    every rank but 0 calls it
 *   count        an all-reduce of 1 + rank elements
 *   dtype        f32 on rank 0, i32 elsewhere (the same bytes)
 *   root         a broadcast whose root is each rank's own
 *   kind         rank 0 calls fsdp_barrier, the others fsdp_allreduce
 *   null-buffer  rank 1 passes a NULL buffer
 *   add-shape    fsdp_param_add of shape [4 + rank]
 *   add-rank0    only rank 0 calls fsdp_param_add
 *   gather-root  fsdp_param_gather to each rank's own root
 *   resize-given fsdp_param_resize with rows given on rank 0 only (not a mistake: rank 0's are read)
 * In a world of 1 none of them is a mistake: each call must then succeed. A call that fails makes the
 * stage (or callback) fail with its message; `ok` tells the test the calls returned 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/callbacks.h"
#include "fsdp/collectives.h"
#include "fsdp/params.h"
#include "fsdp/stage.h"

static const fsdp_param_spec PARAMS[] = {{"case", FSDP_T_STRING, 1, NULL, NULL, "the mistake"},
                                         {"callback", FSDP_T_BOOL, 0, "false", NULL, "make it in a callback"},
                                         {NULL, 0, 0, NULL, NULL, NULL}};

/* tok_embeddings grows by 4 rows of 0.5 given on rank 0 only; rank 0 checks the gathered rows and
 * every rank learns the verdict. */
static int resize_given(fsdp_ctx *ctx, int rank, fsdp_err *err) {
    long i = fsdp_param_find(ctx, "tok_embeddings.weight");
    fsdp_param_info in;
    int rc = i < 0 ? fsdp_err_set(err, FSDP_E_INVALID, "no tok_embeddings.weight") : fsdp_param_info_at(ctx, (size_t)i, &in, err);
    if (rc) return rc;
    const int64_t old = in.shape[0], rn = in.row_numel;
    float *rows = calloc(4 * (size_t)rn, sizeof *rows), *full = calloc((size_t)((old + 4) * rn), sizeof *full);
    if (!rows || !full) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < 4 * rn; k++) rows[k] = 0.5f;
    if (!rc) rc = fsdp_param_resize(ctx, (size_t)i, old + 4, NULL, FSDP_DT_F32, rank == 0 ? rows : NULL, err);
    if (!rc) rc = fsdp_param_gather(ctx, (size_t)i, 0, FSDP_DT_F32, full, err);
    int64_t bad = 0;
    for (int64_t k = old * rn; !rc && rank == 0 && k < (old + 4) * rn; k++) bad += full[k] != 0.5f;
    if (!rc) rc = fsdp_broadcast(ctx, &bad, sizeof bad, 0, err);
    if (!rc && bad) rc = fsdp_err_set(err, FSDP_E_INVALID, "coll-misuse: %lld new elements are not the given 0.5", (long long)bad);
    free(rows);
    free(full);
    return rc;
}

static int mistake(fsdp_ctx *ctx, const char *c, fsdp_err *err) {
    int rank = fsdp_ctx_rank(ctx);
    float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (!strcmp(c, "rank0-only")) return rank == 0 ? fsdp_allreduce(ctx, f, 1, FSDP_DT_F32, FSDP_SUM, err) : 0;
    if (!strcmp(c, "rank0-again")) {
        if (rank != 0) return 0;
        fsdp_err first;
        if (fsdp_allreduce(ctx, f, 1, FSDP_DT_F32, FSDP_SUM, &first) == 0) return 0; /* a world of 1 */
        return fsdp_barrier(ctx, err);
    }
    if (!strcmp(c, "not-rank0")) return rank != 0 ? fsdp_allreduce(ctx, f, 1, FSDP_DT_F32, FSDP_SUM, err) : 0;
    if (!strcmp(c, "count")) return fsdp_allreduce(ctx, f, (size_t)(1 + rank), FSDP_DT_F32, FSDP_SUM, err);
    if (!strcmp(c, "dtype"))
        return fsdp_allreduce(ctx, f, 2, rank == 0 ? FSDP_DT_F32 : FSDP_DT_I32, FSDP_SUM, err);
    if (!strcmp(c, "root")) return fsdp_broadcast(ctx, f, sizeof f, rank, err);
    if (!strcmp(c, "kind")) return rank == 0 ? fsdp_barrier(ctx, err) : fsdp_allreduce(ctx, f, 1, FSDP_DT_F32, FSDP_SUM, err);
    if (!strcmp(c, "null-buffer")) return fsdp_allreduce(ctx, rank == 1 ? NULL : f, 4, FSDP_DT_F32, FSDP_SUM, err);
    int64_t shape[1] = {4 + rank};
    if (!strcmp(c, "add-shape")) return fsdp_param_add(ctx, "extra.bias", 1, shape, FSDP_DT_F32, "zeros", err);
    if (!strcmp(c, "add-rank0")) return rank == 0 ? fsdp_param_add(ctx, "extra.bias", 1, shape, FSDP_DT_F32, "zeros", err) : 0;
    if (!strcmp(c, "gather-root")) {
        fsdp_param_info in;
        int rc = fsdp_param_info_at(ctx, 0, &in, err);
        float *dst = rc ? NULL : malloc((size_t)in.shape[0] * (size_t)in.row_numel * sizeof *dst);
        if (!rc) rc = fsdp_param_gather(ctx, 0, rank, FSDP_DT_F32, dst, err);
        free(dst);
        return rc;
    }
    if (!strcmp(c, "resize-given")) return resize_given(ctx, rank, err);
    return fsdp_err_set(err, FSDP_E_INVALID, "coll-misuse: unknown case %s", c);
}

static int at_step(fsdp_ctx *ctx, const fsdp_step_metrics *m, unsigned *request, void *user, fsdp_err *err) {
    (void)request;
    if (m->is_eval || m->step != 1) return 0;
    int rc = mistake(ctx, (const char *)user, err);
    if (!rc) fsdp_ctx_metric(ctx, "ok", 1);
    return rc;
}

static int run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    const char *c = fsdp_arg_str(with, "case", "");
    if (fsdp_arg_bool(with, "callback", 0)) {
        char *dup = strdup(c);
        if (!dup) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        return fsdp_callback_add(ctx, "misuse", at_step, dup, free, err);
    }
    int rc = mistake(ctx, c, err);
    if (!rc) fsdp_ctx_metric(ctx, "ok", 1);
    return rc;
}

static const fsdp_stage_desc DESC = {FSDP_STAGE_DESC_INIT, "coll-misuse", "a plugin's mistake with collectives",
                                     PARAMS, NULL, NULL, run, NULL};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &DESC, err); }
