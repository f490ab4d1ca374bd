/* Key layouts of training checkpoints (see key_layout.h). */
#include "ckpt/key_layout.h"

#include <stdio.h>
#include <string.h>

int ckl_prefix_check(const char *what, const char *prefix, fsdp_err *err) {
    size_t n = strlen(prefix);
    if (!n) return 0;
    if (n >= CKL_PREFIX_CAP)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: prefix '%.40s...' is %zu bytes long (at most %d)", what, prefix, n,
                            CKL_PREFIX_CAP - 1);
    if (prefix[n - 1] != '.' || prefix[0] == '.' || strstr(prefix, "..") || strpbrk(prefix, "*?[ "))
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "%s: prefix '%s' must be empty or dotted names ending in '.' (e.g. 'model.', 'app.optim.'), "
                            "without '*', '?', '[' or spaces", what, prefix);
    return 0;
}

int ckl_is_moment(const char *name) {
    static const char *const kinds[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"};
    const char *dot = strrchr(name, '.');
    const char *last = dot ? dot + 1 : name;
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (!strcmp(last, kinds[i])) return 1;
    return 0;
}

/* The bytes of name before its first `state.` component that has at least two components after it
 * (<P>state.<fqn>.<kind>), or -1. */
static long state_prefix_len(const char *name) {
    for (const char *p = name; (p = strstr(p, "state.")) != NULL; p++) {
        if (p != name && p[-1] != '.') continue;
        const char *rest = p + 6;
        if (strchr(rest, '.') && rest[0] != '.') return (long)(p - name);
    }
    return -1;
}

/* P's last component optim / optimizer replaced by model (app.optim. -> app.model.), else "model.". */
static void model_beside(const char *optim, char *out) {
    size_t n = strlen(optim);
    const char *last = optim;
    for (size_t i = 0; i + 1 < n; i++)
        if (optim[i] == '.') last = optim + i + 1;
    size_t keep = (size_t)(last - optim);
    if (n && (!strcmp(last, "optim.") || !strcmp(last, "optimizer.")) && keep + 7 < CKL_PREFIX_CAP)
        snprintf(out, CKL_PREFIX_CAP, "%.*smodel.", (int)keep, optim);
    else
        snprintf(out, CKL_PREFIX_CAP, "model.");
}

int ckl_detect(ckpt_reader *r, const char *model, const char *optim, ckl_layout *out, fsdp_err *err) {
    memset(out, 0, sizeof *out);
    int rc;
    if (model && (rc = ckl_prefix_check("prefixes.model", model, err))) return rc;
    if (optim && (rc = ckl_prefix_check("prefixes.optim", optim, err))) return rc;
    if (optim) {
        snprintf(out->optim, sizeof out->optim, "%s", optim);
        out->optim_given = 1;
    } else {
        const char *first = NULL;
        long first_len = -1;
        for (size_t ci = 0; ci < ckpt_count(r); ci++) {
            const ckpt_entry *e = ckpt_entry_at(r, ci);
            if (!e->is_tensor || !ckl_is_moment(e->name)) continue;
            long n = state_prefix_len(e->name);
            if (n < 0) continue;
            if (!first) {
                first = e->name, first_len = n;
                continue;
            }
            if (n != first_len || strncmp(first, e->name, (size_t)n))
                return fsdp_err_set(err, FSDP_E_INVALID,
                                    "the checkpoint holds optimizer state under two prefixes ('%.*s' in %s, '%.*s' in "
                                    "%s): give load-ckpt's prefixes: {optim: ...} (convert: --prefixes optim=...)",
                                    (int)first_len, first, first, (int)n, e->name, e->name);
        }
        if (first && first_len >= CKL_PREFIX_CAP)
            return fsdp_err_set(err, FSDP_E_INVALID, "optimizer key %s: its prefix is longer than %d bytes", first,
                                CKL_PREFIX_CAP - 1);
        if (first) snprintf(out->optim, sizeof out->optim, "%.*s", (int)first_len, first);
        else snprintf(out->optim, sizeof out->optim, "optimizer.");
    }
    if (model) {
        snprintf(out->model, sizeof out->model, "%s", model);
        out->model_given = 1;
    } else {
        model_beside(out->optim, out->model);
    }
    return 0;
}

int ckl_is_training(const ckl_layout *l, const char *name) {
    static const char *const pre[] = {"optimizer.", "train_state.", "lr_scheduler.", "dataloader."};
    if (l->optim[0] && !strncmp(name, l->optim, strlen(l->optim))) return 1;
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
        if (!strncmp(name, pre[i], strlen(pre[i]))) return 1;
    return 0;
}

static void list_key(char *buf, size_t cap, const char *key) {
    size_t used = strlen(buf);
    if (used + 4 >= cap) return;
    if (used + strlen(key) + 8 >= cap) snprintf(buf + used, cap - used, "\n  ...");
    else snprintf(buf + used, cap - used, "\n  %s", key);
}

void ckl_unmapped_moments(ckpt_reader *r, const ckl_layout *l, int (*has_param)(void *, const char *, const char *),
                          void *user, char *bad, char *unknown, size_t cap, size_t *n_bad, size_t *n_unknown,
                          size_t *n_known) {
    size_t ol = strlen(l->optim);
    *n_bad = *n_unknown = *n_known = 0;
    for (size_t ci = 0; ci < ckpt_count(r); ci++) {
        const ckpt_entry *e = ckpt_entry_at(r, ci);
        if (!e->is_tensor || !ckl_is_moment(e->name)) continue;
        int ok = !strncmp(e->name, l->optim, ol) && !strncmp(e->name + ol, "state.", 6);
        char fqn[1024];
        const char *f = e->name + ol + 6, *dot = ok ? strrchr(f, '.') : NULL;
        size_t fl = dot ? (size_t)(dot - f) : 0;
        ok = ok && fl > 0 && fl < sizeof fqn;
        if (!ok) {
            (*n_bad)++;
            list_key(bad, cap, e->name);
            continue;
        }
        memcpy(fqn, f, fl);
        fqn[fl] = 0;
        if (has_param && !has_param(user, fqn, e->name)) {
            (*n_unknown)++;
            list_key(unknown, cap, e->name);
        } else {
            (*n_known)++;
        }
    }
}

int ckl_to_torchtitan(const ckl_layout *l, const char *name, char *out, size_t cap, fsdp_err *err) {
    size_t ml = strlen(l->model), ol = strlen(l->optim);
    int w;
    if (ol && !strncmp(name, l->optim, ol)) w = snprintf(out, cap, "optimizer.%s", name + ol);
    else if (ml && !strncmp(name, l->model, ml)) w = snprintf(out, cap, "%s", name + ml);
    else w = snprintf(out, cap, "%s", name);
    if (w < 0 || (size_t)w >= cap)
        return fsdp_err_set(err, FSDP_E_INVALID, "key %.64s... is too long once rewritten (%d bytes, at most %zu)", name,
                            w, cap - 1);
    return 0;
}
