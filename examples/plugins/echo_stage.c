/* Example plugin stage for fsdp-run: `echo` logs a message (and optionally appends it to a
 * file), showing the whole plugin ABI: descriptor, schema with types/defaults/choices,
 * context calls (log, metrics, progress) and the exported fsdp_stage_register.
 *
 * Build:  cc -shared -fPIC -Iinclude examples/plugins/echo_stage.c -o libecho_stage.so
 * Use:    plugins: [build/plugins/libecho_stage.so]
 *         stages: [{id: hello, uses: echo, with: {message: "hi", repeat: 2}}] */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fsdp/stage.h"

static const char *const LEVELS[] = {"info", "warn", NULL};

static const fsdp_param_spec ECHO_PARAMS[] = {
    {"message", FSDP_T_STRING, 1, NULL, NULL, "the text to print"},
    {"repeat", FSDP_T_INT, 0, "1", NULL, "how many times"},
    {"level", FSDP_T_STRING, 0, "info", LEVELS, "log level of the lines"},
    {"file", FSDP_T_STRING, 0, NULL, NULL, "also append the lines to this file"},
    {NULL, 0, 0, NULL, NULL, NULL}};

static int echo_check(const fsdp_value *with, fsdp_err *err) {
    const fsdp_value *r = fsdp_value_get(with, "repeat");
    int64_t n = 1;
    if (r && fsdp_value_int(r, &n) == 0 && (n < 0 || n > 1000000))
        return fsdp_err_at(err, FSDP_E_INVALID, r, "echo: repeat must be between 0 and 1000000, got %lld",
                           (long long)n);
    return 0;
}

static int echo_run(fsdp_ctx *ctx, const fsdp_value *with, fsdp_err *err) {
    const char *msg = fsdp_arg_str(with, "message", "");
    int64_t n = fsdp_arg_int(with, "repeat", 1);
    int warn = !strcmp(fsdp_arg_str(with, "level", "info"), "warn");
    const char *path = fsdp_arg_str(with, "file", NULL);
    FILE *f = NULL;
    if (path && !(f = fopen(path, "a")))
        return fsdp_err_set(err, FSDP_E_IO, "echo: cannot open %s: %s", path, strerror(errno));
    fsdp_progress *p = fsdp_progress_begin(ctx, "echo", (double)n, "lines");
    for (int64_t i = 0; i < n; i++) {
        fsdp_log(ctx, warn ? FSDP_LOG_WARN : FSDP_LOG_INFO, "%s: %s", fsdp_ctx_stage_id(ctx), msg);
        if (f) fprintf(f, "%s\n", msg);
        fsdp_progress_update(p, (double)(i + 1), NULL);
    }
    fsdp_progress_end(p);
    if (f && fclose(f) != 0) return fsdp_err_set(err, FSDP_E_IO, "echo: cannot write %s", path);
    fsdp_ctx_metric(ctx, "lines", (double)n);
    fsdp_ctx_metric_str(ctx, "recipe", fsdp_ctx_recipe_name(ctx));
    return 0;
}

static const fsdp_stage_desc ECHO_STAGE = {
    FSDP_STAGE_DESC_INIT,
    "echo",
    "print a message (example plugin stage)",
    ECHO_PARAMS,
    NULL,
    NULL,
    echo_run,
    echo_check,
};

int fsdp_stage_register(fsdp_registry *reg, fsdp_err *err) { return fsdp_registry_add(reg, &ECHO_STAGE, err); }
