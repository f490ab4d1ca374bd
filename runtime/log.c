/* Log lines on stderr with a rank prefix and the time since start. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/ctx_impl.h"

void fsdp_log(fsdp_ctx *ctx, fsdp_log_level level, const char *fmt, ...) {
    if (!ctx) return;
    if ((int)level > ctx->verbosity + 1) return; /* quiet: errors+warnings; normal: +info; verbose: +debug */
    /* info/debug come from rank 0 only unless verbose; warnings and errors from every rank */
    if (level >= FSDP_LOG_INFO && ctx->rank != 0 && ctx->verbosity < 2) return;
    char msg[FSDP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    static const char *tags[] = {"error: ", "warning: ", "", "debug: "};
    /* a progress bar on a terminal is erased first so the line is not garbled */
    if (ctx->progress && ctx->log_is_tty) fputs("\r\033[K", ctx->log);
    fprintf(ctx->log, "[r%d %7.1fs] %s%s\n", ctx->rank, ctx_now() - ctx->t0, tags[level], msg);
    fflush(ctx->log);
}
