/* Progress display: a bar with rate and ETA on a terminal, plain periodic lines otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ctx_impl.h"

struct fsdp_progress {
    fsdp_ctx *ctx;
    char label[64], unit[16], status[160];
    double total, done, t0, last_print, last_frac;
    int drawn;
};

#define PLAIN_INTERVAL_S 10.0

static void fmt_eta(double s, char *buf, size_t cap) {
    if (s < 0 || s > 1e7) {
        snprintf(buf, cap, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, cap, "%02ld:%02ld", t / 60, t % 60);
}

static void fmt_qty(double v, const char *unit, char *buf, size_t cap) {
    if (!strcmp(unit, "B")) {
        const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
        int i = 0;
        while (v >= 1024 && i < 4) {
            v /= 1024;
            i++;
        }
        snprintf(buf, cap, "%.1f %s", v, u[i]);
    } else {
        snprintf(buf, cap, "%.6g %s", v, unit);
    }
}

static void draw(fsdp_progress *p, int final) {
    fsdp_ctx *ctx = p->ctx;
    double now = ctx_now(), el = now - p->t0;
    double rate = el > 0 ? p->done / el : 0;
    double frac = p->total > 0 ? p->done / p->total : 0;
    if (frac > 1) frac = 1;
    char eta[32], rq[48];
    fmt_eta(rate > 0 && p->total > 0 ? (p->total - p->done) / rate : -1, eta, sizeof eta);
    fmt_qty(rate, p->unit, rq, sizeof rq);
    if (ctx->log_is_tty) {
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(ctx->log, "\r\033[K[r%d] %s [%s] %5.1f%% %s/s ETA %s %s", ctx->rank, p->label, bar, frac * 100, rq,
                final ? "00:00" : eta, p->status);
        if (final) fputc('\n', ctx->log);
    } else {
        fprintf(ctx->log, "[r%d %7.1fs] %s: %.0f/%.0f %s (%.1f%%), %s/s, ETA %s%s%s\n", ctx->rank, now - ctx->t0,
                p->label, p->done, p->total, p->unit, frac * 100, rq, final ? "00:00" : eta, p->status[0] ? ", " : "",
                p->status);
    }
    fflush(ctx->log);
    p->last_print = now;
    p->last_frac = frac;
    p->drawn = 1;
}

fsdp_progress *fsdp_progress_begin(fsdp_ctx *ctx, const char *label, double total, const char *unit) {
    if (!ctx) return NULL;
    ctx_progress_close(ctx);
    fsdp_progress *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ctx = ctx;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    p->total = total;
    p->t0 = p->last_print = ctx_now();
    ctx->progress = p;
    return p;
}

void fsdp_progress_update(fsdp_progress *p, double done, const char *status) {
    if (!p) return;
    p->done = done;
    snprintf(p->status, sizeof p->status, "%s", status ? status : "");
    fsdp_ctx *ctx = p->ctx;
    if (ctx->rank != 0 || ctx->verbosity < 1) return;
    double now = ctx_now();
    double frac = p->total > 0 ? done / p->total : 0;
    if (ctx->log_is_tty) {
        if (now - p->last_print >= 0.1 || done >= p->total) draw(p, 0);
    } else if (now - p->last_print >= PLAIN_INTERVAL_S || frac - p->last_frac >= 0.1) {
        draw(p, 0);
    }
}

void fsdp_progress_end(fsdp_progress *p) {
    if (!p) return;
    fsdp_ctx *ctx = p->ctx;
    double frac = p->total > 0 ? p->done / p->total : 0;
    if (ctx->rank == 0 && ctx->verbosity >= 1 && (ctx->log_is_tty || (p->drawn && p->last_frac < frac)))
        draw(p, 1);
    if (ctx->progress == p) ctx->progress = NULL;
    free(p);
}

void ctx_progress_close(fsdp_ctx *ctx) {
    if (ctx && ctx->progress) fsdp_progress_end(ctx->progress);
}
