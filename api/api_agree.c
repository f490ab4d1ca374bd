/* The plugin API's agreement on a collective call (api/api_agree.h). */
#include "api/api_agree.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_util.h"
#include "fsdp/collectives.h"

void api_call_init(api_call *c, const char *call) {
    memset(c, 0, sizeof *c);
    snprintf(c->call, sizeof c->call, "%s", call);
}

void api_call_name(api_call *c, const char *name) {
    c->has |= API_HAS_NAME;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "(NULL)");
}

void api_call_rule(api_call *c, const char *rule) {
    c->has |= API_HAS_RULE;
    snprintf(c->rule, sizeof c->rule, "%s", rule ? rule : "(NULL)");
}

void api_call_bad(api_call *c, const char *what) {
    if (!c->bad[0]) snprintf(c->bad, sizeof c->bad, "%s", what);
}

static const char *op_name(int op) { return op == FSDP_SUM ? "sum" : op == FSDP_MAX ? "max" : op == FSDP_MIN ? "min" : "?"; }

void api_call_describe(const api_call *c, char *buf, size_t cap) {
    size_t off = 0;
#define PUT(...) (off += (size_t)snprintf(buf + off, off < cap ? cap - off : 0, __VA_ARGS__), off = off < cap ? off : cap)
    PUT("%s(", c->call);
    const char *sep = "";
    if (c->has & API_HAS_INDEX) PUT("%sparameter %lld", sep, (long long)c->count), sep = ", ";
    if (c->has & API_HAS_NAME) PUT((c->has & API_HAS_INDEX) ? " %s" : "%s%s", (c->has & API_HAS_INDEX) ? c->name : sep,
                                   (c->has & API_HAS_INDEX) ? "" : c->name), sep = ", ";
    if (c->has & API_HAS_SHAPE) {
        PUT("%sshape [", sep);
        for (int d = 0; d < c->ndim && d < FSDP_MAX_DIMS; d++) PUT("%s%lld", d ? ", " : "", (long long)c->shape[d]);
        PUT("]"), sep = ", ";
    }
    if (c->has & API_HAS_ELEMS) PUT("%s%lld element%s", sep, (long long)c->count, c->count == 1 ? "" : "s"), sep = ", ";
    if (c->has & API_HAS_BYTES) PUT("%s%lld byte%s", sep, (long long)c->count, c->count == 1 ? "" : "s"), sep = ", ";
    if (c->has & API_HAS_TRAINABLE) PUT("%strainable %lld", sep, (long long)c->rows), sep = ", ";
    if (c->has & API_HAS_ROWS) PUT("%s%lld row%s", sep, (long long)c->rows, c->rows == 1 ? "" : "s"), sep = ", ";
    if (c->has & API_HAS_DTYPE) {
        const char *dn = fsdp_dtype_name((fsdp_dtype)c->dtype);
        PUT("%s%s", sep, dn ? dn : "(invalid dtype)"), sep = ", ";
    }
    if (c->has & API_HAS_OP) PUT("%s%s", sep, op_name(c->op)), sep = ", ";
    if (c->has & API_HAS_ROOT) PUT("%sroot %d", sep, c->root), sep = ", ";
    if (c->has & API_HAS_RULE) PUT("%sinit '%s'", sep, c->rule), sep = ", ";
    if (c->bad[0]) PUT("%s%s", sep, c->bad);
    PUT(")");
#undef PUT
}

/* "0, 2, 5" of the ranks r with pick[r] == want, into buf. */
static void rank_list(const unsigned char *pick, int n, int want, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (int r = 0; r < n && off + 1 < cap; r++)
        if ((pick[r] != 0) == (want != 0)) off += (size_t)snprintf(buf + off, cap - off, "%s%d", off ? ", " : "", r);
}

static int timed_out(fsdp_ctx *ctx, const api_call *mine, const unsigned char *arrived, int n, const char *why,
                     fsdp_err *err) {
    char here[256], away[256];
    rank_list(arrived, n, 1, here, sizeof here);
    rank_list(arrived, n, 0, away, sizeof away);
    if (!strstr(why, "timed out"))
        return api_fail(ctx, err, FSDP_E_COMM, mine->call, "call %llu of the plugin API's collectives: %s",
                        (unsigned long long)mine->seq, why);
    return api_fail(ctx, err, FSDP_E_COMM, mine->call,
                    "call %llu of the plugin API's collectives: rank %d waited %.3g s (runtime.collective_timeout) "
                    "and rank(s) %s never made this call (ranks that did: %s): a collective called by some ranks "
                    "only, or a rank that much slower",
                    (unsigned long long)mine->seq, fsdp_ctx_rank(ctx), ctx->api_timeout_s, away, here);
}

/* Every distinct record once, with the ranks that passed it: "rank 1 passed X; ranks 0, 2 passed Y". */
static int disagree(fsdp_ctx *ctx, const api_call *all, int n, fsdp_err *err) {
    unsigned char *done = calloc((size_t)n, 2);
    if (!done) return api_fail(ctx, err, FSDP_E_NOMEM, all[0].call, "out of memory");
    unsigned char *same = done + n;
    char msg[FSDP_ERR_MSG_MAX];
    size_t off = 0;
    for (int r = 0; r < n && off + 1 < sizeof msg; r++) {
        if (done[r]) continue;
        int k = 0;
        for (int q = 0; q < n; q++) {
            same[q] = !done[q] && !memcmp(&all[q], &all[r], offsetof(api_call, root_flag));
            if (same[q]) done[q] = 1, k++;
        }
        char ranks[256], what[512];
        rank_list(same, n, 1, ranks, sizeof ranks);
        api_call_describe(&all[r], what, sizeof what);
        off += (size_t)snprintf(msg + off, sizeof msg - off, "%s%s %s called %s (call %llu)", off ? "; " : "",
                                k > 1 ? "ranks" : "rank", ranks, what, (unsigned long long)all[r].seq);
    }
    free(done);
    return api_fail(ctx, err, FSDP_E_INVALID, all[fsdp_ctx_rank(ctx)].call,
                    "the ranks made different collective calls: %s (every rank makes the same calls with the same "
                    "arguments, in the same order)", msg);
}

int api_agree(fsdp_ctx *ctx, api_call *mine, int root, api_call *of_root, fsdp_err *err) {
    comm *c = ctx_api_comm(ctx);
    if (!c) return api_fail(ctx, err, FSDP_E_COMM, mine->call, "the plugin API's communicator could not be made");
    if (comm_broken(c))
        return api_fail(ctx, err, FSDP_E_COMM, mine->call,
                        "an earlier collective of the plugin API failed (%s): no other can run", comm_broken(c));
    int n = comm_size(c);
    mine->seq = comm_exchange_count(c);
    api_call *all = malloc((size_t)n * sizeof *all);
    unsigned char *arrived = malloc((size_t)n);
    if (!all || !arrived) {
        free(all);
        free(arrived);
        return api_fail(ctx, err, FSDP_E_NOMEM, mine->call, "out of memory");
    }
    fsdp_err e;
    fsdp_err_clear(&e);
    int rc = comm_exchange_timed(c, mine, sizeof *mine, all, ctx->api_timeout_s, arrived, &e);
    if (rc) {
        rc = timed_out(ctx, mine, arrived, n, e.msg, err);
    } else {
        for (int r = 0; r < n && !rc; r++)
            if (memcmp(&all[r], mine, offsetof(api_call, root_flag))) rc = disagree(ctx, all, n, err);
        if (!rc && of_root && root >= 0 && root < n) *of_root = all[root];
    }
    free(all);
    free(arrived);
    return rc;
}

int api_agree_result(fsdp_ctx *ctx, comm *c, int rc, fsdp_err *err) {
    (void)ctx;
    int who = -1;
    fsdp_err e2;
    fsdp_err_clear(&e2);
    int agreed = comm_agree(c, rc, &who, &e2);
    if (!agreed && !rc) return 0;
    if (who < 0 || who >= comm_size(c)) return rc ? rc : fsdp_err_set(err, agreed, "%s", e2.msg);
    /* the failing rank's message to every rank (the failing rank takes part too) */
    char msg[FSDP_ERR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", comm_rank(c) == who ? err->msg : "");
    int brc = comm_bcast(c, msg, sizeof msg, who, &e2);
    if (rc) return rc;
    if (brc) return fsdp_err_set(err, agreed, "rank %d failed", who);
    return fsdp_err_set(err, agreed, "rank %d: %s", who, msg);
}
