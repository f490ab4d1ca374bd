/* A plugin's state in the checkpoints (include/fsdp/ckpt.h, stage ABI 1.2): named bytes kept in the
 * model's state (runtime/state.h's blobs), which the saves write and the loads give back. */
#include "fsdp/ckpt.h"

#include <ctype.h>
#include <string.h>

#include "api/api_util.h"
#include "runtime/err_local.h"

/* "<prefix>.<name>" of 1-128 of a-z, A-Z, 0-9, '_', '-', '.', with a prefix and a name. */
static int key_ok(const char *key) {
    size_t n = key ? strlen(key) : 0;
    const char *dot = key ? strchr(key, '.') : NULL;
    if (!n || n > 128 || !dot || dot == key || !dot[1]) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)key[i]) && !strchr("_-.", key[i])) return 0;
    return 1;
}

int fsdp_plugin_state_set(fsdp_ctx *ctx, const char *key, const void *data, size_t n, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_plugin_state_set";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s) return err->code;
    if (!key_ok(key))
        return api_fail(ctx, err, FSDP_E_INVALID, call, "key '%s': expected \"<prefix>.<name>\" of 1-128 of a-z, A-Z, "
                        "0-9, '_', '-', '.'", key ? key : "(NULL)");
    if (n && !data) return api_fail(ctx, err, FSDP_E_INVALID, call, "%s: NULL data of %zu bytes", key, n);
    int rc = state_blob_set(s, key, data, n, err);
    return rc ? api_fail(ctx, err, rc, call, "%s", err->msg) : 0;
}

int fsdp_plugin_state_get(fsdp_ctx *ctx, const char *key, const void **data, size_t *n, fsdp_err *err) {
    FSDP_ERR_LOCAL(err);
    const char *call = "fsdp_plugin_state_get";
    fsdp_state *s = api_state(ctx, call, err);
    if (!s) return err->code;
    if (!data || !n) return api_fail(ctx, err, FSDP_E_INVALID, call, "NULL data or n");
    const state_blob *b = state_blob_get(s, key);
    if (!b) return api_fail(ctx, err, FSDP_E_INVALID, call, "no state under '%s'", key ? key : "(NULL)");
    *data = b->data;
    *n = b->n;
    return 0;
}
