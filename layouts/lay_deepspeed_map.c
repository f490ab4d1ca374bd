/* Each DeepSpeed parameter onto the ranks' flat partitions (layouts/lay_deepspeed.h): its fp32 weights and
 * AdamW moments as pieces of them, under fsdp-run's names, q/k rows in its order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/lay_deepspeed_impl.h"

static long find(const lay_ds *d, const char *fmt, int a, int b) {
    char key[512];
    snprintf(key, sizeof key, fmt, a, b);
    return ckpt_find(d->u, key);
}

static int64_t len_of(const lay_ds *d, long i) {
    const ckpt_entry *e = i >= 0 ? ckpt_entry_at(d->u, (size_t)i) : NULL;
    return e && e->is_tensor && e->ndim == 1 ? e->shape[0] : -1;
}

static int missing(const lay_ds *d, const char *what, int rank, int group, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: rank %d's optimizer file has no flat %s of group %d",
                        d->path, rank, what, group);
}

static int add_piece(lay_ds *d, size_t src, int64_t s0, int64_t v0, int64_t n, fsdp_err *err) {
    if (d->n_pieces == d->cap_pieces) {
        size_t cap = d->cap_pieces ? 2 * d->cap_pieces : 256;
        ckv_piece *p = realloc(d->pieces, cap * sizeof *p);
        if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        d->pieces = p, d->cap_pieces = cap;
    }
    d->pieces[d->n_pieces++] = (ckv_piece){src, s0, v0, n};
    return 0;
}

/* Where a parameter's elements are: ZeRO-1/2 at flat offset off of group g's partitions of P elements; ZeRO-3 in
 * partitions of pn elements, at offset local of sub group k on every rank. */
typedef struct place {
    int64_t off, P;    /* ZeRO-1/2 */
    int64_t pn, local; /* ZeRO-3 */
    int group;         /* g (ZeRO-1/2) or k (ZeRO-3) */
} place;

/* kind 0: fp32 weights, 1: exp_avg, 2: exp_avg_sq -- rank r's flat tensor of the place's group */
static long flat_of(const lay_ds *d, const place *pl, int kind, int r) {
    static const char *const z2[3] = {"r%d.optimizer_state_dict.single_partition_of_fp32_groups.%d",
                                      "r%d.optimizer_state_dict.base_optimizer_state.state.%d.exp_avg",
                                      "r%d.optimizer_state_dict.base_optimizer_state.state.%d.exp_avg_sq"};
    static const char *const z3[3] = {"r%d.optimizer_state_dict.fp32_flat_groups.%d",
                                      "r%d.optimizer_state_dict.optimizer_state_dict.state.%d.exp_avg",
                                      "r%d.optimizer_state_dict.optimizer_state_dict.state.%d.exp_avg_sq"};
    return find(d, (d->stage == 3 ? z3 : z2)[kind], r, pl->group);
}

/* Parameter elements [e, e + n) of kind at view elements [v, v + n), cut where the ranks' partitions are. */
static int pieces_of(lay_ds *d, const place *pl, int kind, int64_t e, int64_t v, int64_t n, fsdp_err *err) {
    while (n > 0) {
        int r;
        int64_t local, take;
        if (d->stage == 3) {
            r = (int)(e / pl->pn);
            local = pl->local + e % pl->pn;
            take = pl->pn - e % pl->pn;
        } else {
            int64_t x = pl->off + e;
            r = (int)(x / pl->P);
            local = x % pl->P;
            take = pl->P - local;
        }
        if (take > n) take = n;
        long src = r < d->ranks ? flat_of(d, pl, kind, r) : -1;
        if (src < 0) return missing(d, kind ? "moment" : "fp32 partition", r, pl->group, err);
        if (local + take > len_of(d, src))
            return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: %s holds %lld elements, the parameters "
                                "need %lld (a truncated partition)", d->path, ckpt_entry_at(d->u, (size_t)src)->name,
                                (long long)len_of(d, src), (long long)(local + take));
        int rc = add_piece(d, (size_t)src, local, v, take, err);
        if (rc) return rc;
        e += take, v += take, n -= take;
    }
    return 0;
}

/* One tensor (kind) of parameter p under name: its rows in fsdp-run's order (heads > 0: q/k rows permuted). */
static int add_tensor(lay_ds *d, const lay_ds_param *p, const place *pl, int kind, int heads, const char *name,
                      fsdp_err *err) {
    d->n_pieces = 0;
    int rc = 0;
    if (heads > 0) {
        int64_t rows = p->shape[0], c = p->numel / rows;
        for (int64_t v = 0; v < rows && !rc; v++)
            rc = pieces_of(d, pl, kind, nmap_perm_src_row(NMAP_HF_TO_TT, rows, heads, v) * c, v * c, c, err);
    } else {
        rc = pieces_of(d, pl, kind, 0, 0, p->numel, err);
    }
    return rc ? rc : ckv_add_pieces(d->b, name, p->ndim, p->shape, d->pieces, d->n_pieces, err);
}

/* The int lists of "[[0, 0], [0]]" (param_alignment_paddings): item i of list g, 0 when absent. */
static int64_t nested_int(const char *t, int g, size_t i) {
    if (!t) return 0;
    const char *p = strchr(t, '[');
    for (int k = 0; p && k <= g; k++) p = strchr(p + 1, '[');
    if (!p) return 0;
    p++;
    for (size_t k = 0; k < i; k++) {
        p = strpbrk(p, ",]");
        if (!p || *p == ']') return 0;
        p++;
    }
    return strtoll(p, NULL, 10);
}

/* The step and the options of the param group / sub group of pl for fsdp-run's parameter cn. */
static int add_values(lay_ds *d, const place *pl, const char *cn, fsdp_err *err) {
    char key[1400];
    const char *base = d->stage == 3 ? "r0.optimizer_state_dict.optimizer_state_dict." : "r0.optimizer_state_dict."
                                                                                         "base_optimizer_state.";
    snprintf(key, sizeof key, "%sstate.%d.step", base, pl->group);
    long s = ckpt_find(d->u, key);
    int rc = 0;
    if (s >= 0) {
        snprintf(key, sizeof key, "optimizer.state.%s.step", cn);
        rc = ckv_add_same(d->b, key, (size_t)s, err);
    }
    /* the options of the optimizer param group holding the (sub) group: ZeRO-1/2's group g is param group g; a
     * ZeRO-3 sub group k is in the group whose params list holds it (one group: 0) */
    int g = d->stage == 3 ? 0 : pl->group;
    char pre[256];
    snprintf(pre, sizeof pre, "%sparam_groups.%d.", base, g);
    size_t pl_len = strlen(pre);
    if (!d->opts || d->opts_group != g) { /* the group's option entries, once */
        free(d->opts);
        d->n_opts = 0, d->opts_group = g;
        if (!(d->opts = malloc((ckpt_count(d->u) ? ckpt_count(d->u) : 1) * sizeof *d->opts)))
            return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        for (size_t i = 0; i < ckpt_count(d->u); i++) {
            const char *name = ckpt_entry_at(d->u, i)->name;
            if (!strncmp(name, pre, pl_len) && strcmp(name + pl_len, "params")) d->opts[d->n_opts++] = i;
        }
    }
    for (size_t k = 0; k < d->n_opts && !rc; k++) {
        snprintf(key, sizeof key, "optimizer.param_groups.%s.%s", cn, ckpt_entry_at(d->u, d->opts[k])->name + pl_len);
        rc = ckv_add_same(d->b, key, d->opts[k], err);
    }
    return rc;
}

/* ZeRO-3: the sub group k and the offset in it of a parameter starting at cum in the rank's flat partition. */
static int sub_group(const lay_ds *d, int64_t cum, int64_t pn, place *pl, fsdp_err *err) {
    int64_t start = 0;
    for (int k = 0;; k++) {
        long i = find(d, "r%d.optimizer_state_dict.fp32_flat_groups.%d", 0, k);
        int64_t len = len_of(d, i);
        if (len < 0) break;
        if (cum + pn <= start + len) {
            pl->group = k, pl->local = cum - start, pl->pn = pn;
            return 0;
        }
        start += len;
    }
    return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: the ZeRO-3 partitions hold fewer elements than "
                        "param_shapes' parameters need", d->path);
}

static int map_param(lay_ds *d, const lay_ds_param *p, const place *pl, fsdp_err *err) {
    char cn[NMAP_NAME_MAX], key[NMAP_NAME_MAX + 64];
    nmap_info info;
    fsdp_err e2;
    if (nmap_map_hf(NMAP_HF_TO_TT, p->name, &d->hf, cn, sizeof cn, &info, &e2))
        return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: parameter %s: %s", d->path, p->name, e2.msg);
    if (info.dropped) return 0;
    if (info.stacked)
        return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: %s is an expert: mixtures of experts are not "
                            "read from ZeRO checkpoints yet", d->path, p->name);
    int heads = info.qk != NMAP_QK_NONE ? info.heads : 0;
    if (info.qk != NMAP_QK_NONE && heads <= 0)
        return fsdp_err_set(err, FSDP_E_INVALID, "DeepSpeed checkpoint %s: %s needs the model's head counts to order "
                            "its rows (pass --n-heads and --n-kv-heads, or --model)", d->path, p->name);
    if (heads > 0 && (p->ndim < 1 || nmap_perm_check(p->shape[0], heads, &e2)))
        return fsdp_err_set(err, FSDP_E_FORMAT, "DeepSpeed checkpoint %s: %s: %s", d->path, p->name, e2.msg);
    static const char *const kind[3] = {"", ".exp_avg", ".exp_avg_sq"};
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        snprintf(key, sizeof key, "%s%s%s", k ? "optimizer.state." : "", cn, kind[k]);
        rc = add_tensor(d, p, pl, k, heads, key, err);
    }
    return rc ? rc : add_values(d, pl, cn, err);
}

int lay_ds_map(lay_ds *d, fsdp_err *err) {
    int rc = 0, g = -1;
    int64_t off = 0, cum = 0;
    size_t gi = 0; /* the parameter's index in its group */
    for (size_t i = 0; i < d->n && !rc; i++) {
        const lay_ds_param *p = &d->p[i];
        place pl;
        memset(&pl, 0, sizeof pl);
        if (p->group != g) g = p->group, off = 0, gi = 0;
        if (d->stage == 3) {
            int64_t pn = (p->numel + d->ranks - 1) / d->ranks;
            if (!(rc = sub_group(d, cum, pn, &pl, err))) cum += pn;
        } else {
            pl.group = g;
            pl.off = off;
            pl.P = len_of(d, flat_of(d, &pl, 1, 0));
            if (pl.P <= 0) rc = missing(d, "moment", 0, g, err);
            long pads = ckpt_find(d->u, "r0.optimizer_state_dict.param_alignment_paddings");
            off += p->numel + nested_int(pads >= 0 ? ckpt_value_text(d->u, (size_t)pads) : NULL, g, gi);
        }
        gi++;
        if (!rc) rc = map_param(d, p, &pl, err);
    }
    long gs = ckpt_find(d->u, "ms.global_steps");
    if (!rc && gs >= 0) rc = ckv_add_same(d->b, "train_state.step", (size_t)gs, err);
    return rc;
}
