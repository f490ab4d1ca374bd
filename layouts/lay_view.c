/* A checkpoint seen in another layout (layouts/layout.h): each entry's rows computed from the layout's row
 * and gathered into runs of a view (ckpt/reader_view.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/lay_view_impl.h"

#define CANON_OPTIM LAY_CANON_OPTIM
#define NAME_CAP LAY_NAME_CAP

typedef lay_pair pair;
typedef lay_job job;
typedef lay_kkind kkind;
#define K_WEIGHT LAY_K_WEIGHT
#define K_MOMENT LAY_K_MOMENT
#define K_OPTION LAY_K_OPTION
#define K_OTHER LAY_K_OTHER

static const char *model_prefix(const job *J, int native) {
    return native ? J->L->model : "";
}
static const char *optim_prefix(const job *J, int native) {
    return native ? J->L->optim : CANON_OPTIM;
}

int lay_canon_extra(const char *key) {
    static const char *const pre[] = {"train_state.", "lr_scheduler.", "dataloader."};
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
        if (nmap_strip_prefix(key, pre[i])) return 1;
    return 0;
}

kkind lay_classify(const job *J, int native, const char *key, char *fqn, char *last) {
    const char *op = optim_prefix(J, native), *r;
    if (!native && lay_canon_extra(key)) return K_OTHER;
    char st[256], pg[256];
    snprintf(st, sizeof st, "%sstate.", op);
    snprintf(pg, sizeof pg, "%sparam_groups.", op);
    kkind k = K_OTHER;
    if ((r = nmap_strip_prefix(key, st))) k = K_MOMENT;
    else if ((r = nmap_strip_prefix(key, pg))) k = K_OPTION;
    else if ((r = nmap_strip_prefix(key, model_prefix(J, native)))) k = K_WEIGHT;
    if (k == K_OTHER) return k;
    snprintf(fqn, NAME_CAP, "%s", r);
    last[0] = '\0';
    if (k != K_WEIGHT) {
        char *dot = strrchr(fqn, '.');
        if (!dot) return K_OTHER;
        snprintf(last, 128, "%s", dot + 1);
        *dot = '\0';
    }
    return k;
}

int lay_full_name(const job *J, int native, kkind k, const char *fqn, const char *last, char *out, fsdp_err *err) {
    int n;
    const char *op = optim_prefix(J, native);
    if (k == K_MOMENT) n = snprintf(out, NAME_CAP, "%sstate.%s.%s", op, fqn, last);
    else if (k == K_OPTION) n = snprintf(out, NAME_CAP, "%sparam_groups.%s.%s", op, fqn, last);
    else n = snprintf(out, NAME_CAP, "%s%s", model_prefix(J, native), fqn);
    return n >= NAME_CAP ? fsdp_err_set(err, FSDP_E_INVALID, "a name under layout %s is too long: %s", J->L->name, fqn)
                         : 0;
}

int lay_canon_fqns(const job *J, const char *fqn, unsigned what, char (*out)[NAME_CAP], int *n, fsdp_err *err) {
    const lay_layout *L = J->L;
    *n = 1;
    for (size_t f = 0; f < L->n_fuse; f++) {
        const lay_fuse *F = &L->fuse[f];
        if (!(F->what & what) || nmap_glob_match(F->native, fqn, NULL) < 0) continue;
        for (int p = 0; p < F->n_part; p++) {
            int rc = nmap_glob_rewrite(F->native, F->part[p], fqn, out[p], NAME_CAP, err);
            if (rc) return rc;
        }
        *n = F->n_part;
        return 0;
    }
    for (size_t r = 0; r < L->n_names; r++)
        if (nmap_glob_match(L->names[r].native, fqn, NULL) >= 0)
            return nmap_glob_rewrite(L->names[r].native, L->names[r].canon, fqn, out[0], NAME_CAP, err);
    snprintf(out[0], NAME_CAP, "%s", fqn);
    return 0;
}

int lay_native_fqn(const job *J, const char *fqn, unsigned what, char *out, int *secondary, fsdp_err *err) {
    const lay_layout *L = J->L;
    *secondary = 0;
    for (size_t f = 0; f < L->n_fuse; f++) {
        const lay_fuse *F = &L->fuse[f];
        if (!(F->what & what)) continue;
        if (nmap_glob_match(F->part[0], fqn, NULL) >= 0) return nmap_glob_rewrite(F->part[0], F->native, fqn, out, NAME_CAP, err);
        for (int p = 1; p < F->n_part; p++)
            if (nmap_glob_match(F->part[p], fqn, NULL) >= 0) {
                *secondary = 1;
                return nmap_glob_rewrite(F->part[p], F->native, fqn, out, NAME_CAP, err);
            }
    }
    for (size_t r = 0; r < L->n_names; r++)
        if (nmap_glob_match(L->names[r].canon, fqn, NULL) >= 0)
            return nmap_glob_rewrite(L->names[r].canon, L->names[r].native, fqn, out, NAME_CAP, err);
    snprintf(out, NAME_CAP, "%s", fqn);
    return 0;
}

/* Heads of the q/k row permutation for a canonical fqn under a rotate-half layout (0: none). */
static int qk_heads(const job *J, const char *canon) {
    if (J->L->rope != LAY_ROPE_HALF) return 0;
    static const char *const q[] = {"**.wq.weight", "**.wq.bias"}, *const k[] = {"**.wk.weight", "**.wk.bias"},
                             *const h[] = {"**.q_norm.weight", "**.k_norm.weight"};
    int kv = J->f->n_kv_heads > 0 ? J->f->n_kv_heads : J->f->n_heads;
    for (int i = 0; i < 2; i++) {
        if (nmap_glob_match(q[i], canon, NULL) >= 0) return J->f->n_heads > 0 ? J->f->n_heads : -1;
        if (nmap_glob_match(k[i], canon, NULL) >= 0) return kv > 0 ? kv : -1;
        if (nmap_glob_match(h[i], canon, NULL) >= 0) return 1;
    }
    return 0;
}

static int need_heads(const job *J, const char *what, fsdp_err *err) {
    return fsdp_err_set(err, FSDP_E_INVALID, "%s: layout %s needs the model's head counts to order its rows (pass "
                        "--n-heads and --n-kv-heads, or --model)", what, J->L->name);
}

static pair *pairs(job *J, size_t n, fsdp_err *err) {
    if (n > J->p_cap) {
        pair *p = realloc(J->p, n * sizeof *p);
        if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory"), NULL;
        J->p = p, J->p_cap = n;
    }
    return J->p;
}

static int cmp_pair(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    return x->s < y->s ? -1 : x->s > y->s;
}

/* The view tensor `name` of shape[ndim] whose row p[k].v is source row p[k].s of p[k].src: its runs (source
 * rows in order, consecutive ones with view rows in a constant step joined). */
static int add_pairs(job *J, const char *name, int ndim, const int64_t *shape, size_t n, fsdp_err *err) {
    pair *p = J->p;
    qsort(p, n, sizeof *p, cmp_pair);
    ckv_run *run = malloc(n * sizeof *run);
    if (!run) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        ckv_run *u = m ? &run[m - 1] : NULL;
        if (u && u->src == p[k].src && p[k].s == u->s0 + u->n) {
            int64_t last = u->v0 + (u->n - 1) * u->vstride, step = p[k].v - last;
            if (u->n == 1 && step > 0) u->vstride = step;
            if (step == u->vstride && step > 0) {
                u->n++;
                continue;
            }
        }
        run[m++] = (ckv_run){p[k].src, p[k].v, 1, p[k].s, 1, 1};
    }
    int rc = ckv_add_tensor(J->b, name, ndim, shape, run, m, err);
    free(run);
    return rc;
}

/* ------------------------------------------------------------------ row maps */

/* Within one tensor of `rows` rows and `heads` heads: the row of the other order that view row v comes
 * from (TO_CANON: canonical interleaved v from the trainer's rotate-half; FROM_CANON the inverse). */
static int64_t rope_row(const job *J, int64_t rows, int heads, int64_t v) {
    if (heads <= 0) return v;
    return nmap_perm_src_row(J->dir == LAY_TO_CANON ? NMAP_HF_TO_TT : NMAP_TT_TO_HF, rows, heads, v);
}

/* Rows of part p of a fused tensor of `total` rows. */
static int part_rows(const job *J, const lay_fuse *F, int p, int64_t total, int64_t *rows, int64_t *hd,
                     const char *what, fsdp_err *err) {
    *hd = 0;
    if (F->kind == LAY_FUSE_EQUAL) {
        if (total % F->n_part)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: %lld rows do not split into %d equal parts (layout %s)",
                                what, (long long)total, F->n_part, J->L->name);
        *rows = total / F->n_part;
        return 0;
    }
    int h = J->f->n_heads, kv = J->f->n_kv_heads > 0 ? J->f->n_kv_heads : h;
    if (h <= 0) return need_heads(J, what, err);
    if (total % (h + 2 * kv) || h % kv)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s: %lld rows are not q, k and v of %d heads and %d kv heads "
                            "(layout %s)", what, (long long)total, h, kv, J->L->name);
    *hd = total / (h + 2 * kv);
    *rows = (p == 0 ? h : kv) * *hd;
    return 0;
}

/* The fused row of row u of part p. */
static int64_t fused_row(const job *J, const lay_fuse *F, int p, int64_t u, int64_t part0_rows, int64_t hd) {
    int h = J->f->n_heads, kv = J->f->n_kv_heads > 0 ? J->f->n_kv_heads : h;
    if (F->kind == LAY_FUSE_EQUAL) return p * part0_rows + u;
    if (F->kind == LAY_FUSE_QKV) return p == 0 ? u : h * hd + (p - 1) * kv * hd + u;
    int64_t g = h / kv, head = u / hd, d = u % hd;
    if (p == 0) return ((head / g) * (g + 2) + head % g) * hd + d;
    return (head * (g + 2) + g + (p - 1)) * hd + d;
}

/* ------------------------------------------------------------------ one key */

static int shape_rows(const ckpt_entry *e, int ndim_min) { return e->is_tensor && e->ndim >= ndim_min; }

/* A renamed entry, its rows permuted for a q/k tensor of a rotate-half layout. */
static int add_renamed(job *J, size_t i, const char *name, const char *canon_fqn, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(J->src, i);
    int heads = shape_rows(e, 1) ? qk_heads(J, canon_fqn) : 0;
    if (heads < 0) return need_heads(J, e->name, err);
    if (!heads) return ckv_add_same(J->b, name, i, err);
    int64_t rows = e->shape[0];
    int rc = nmap_perm_check(rows, heads, err);
    if (rc) return fsdp_err_prefix(err, "%s (layout %s)", e->name, J->L->name);
    pair *p = pairs(J, (size_t)rows, err);
    if (!p) return err->code;
    for (int64_t v = 0; v < rows; v++) p[v] = (pair){i, rope_row(J, rows, heads, v), v};
    return add_pairs(J, name, e->ndim, e->shape, (size_t)rows, err);
}

/* TO_CANON: source entry i, a fused tensor (or its moment / option): one canonical entry per part. */
static int split_fused(job *J, size_t i, const lay_fuse *F, kkind k, const char *fqn, const char *last,
                       fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(J->src, i);
    char cf[NAME_CAP], name[NAME_CAP];
    int64_t total = shape_rows(e, 1) ? e->shape[0] : 0, rows0 = 0, hd = 0;
    for (int p = 0; p < F->n_part; p++) {
        int rc = nmap_glob_rewrite(F->native, F->part[p], fqn, cf, sizeof cf, err);
        if (!rc) rc = lay_full_name(J, 0, k, cf, last, name, err);
        if (rc) return rc;
        if (!total) { /* a 0-d step or an option: the same for every part */
            if ((rc = ckv_add_same(J->b, name, i, err))) return rc;
            continue;
        }
        int64_t rows;
        if ((rc = part_rows(J, F, p, total, &rows, &hd, e->name, err))) return rc;
        if (p == 0) rows0 = rows;
        int heads = qk_heads(J, cf);
        if (heads < 0) return need_heads(J, e->name, err);
        pair *pp = pairs(J, (size_t)rows, err);
        if (!pp) return err->code;
        for (int64_t v = 0; v < rows; v++)
            pp[v] = (pair){i, fused_row(J, F, p, rope_row(J, rows, heads, v), rows0, hd), v};
        int64_t shape[FSDP_MAX_DIMS];
        memcpy(shape, e->shape, sizeof shape);
        shape[0] = rows;
        if ((rc = add_pairs(J, name, e->ndim, shape, (size_t)rows, err))) return rc;
    }
    return 0;
}

/* FROM_CANON: the parts of fused F whose part 0 is canonical fqn: one fused entry in the trainer's names. */
static int join_fused(job *J, size_t i, const lay_fuse *F, kkind k, const char *fqn, const char *last,
                      fsdp_err *err) {
    const ckpt_entry *e0 = ckpt_entry_at(J->src, i);
    char nf[NAME_CAP], name[NAME_CAP], pf[NAME_CAP], pn[NAME_CAP];
    int rc = nmap_glob_rewrite(F->part[0], F->native, fqn, nf, sizeof nf, err);
    if (!rc) rc = lay_full_name(J, 1, k, nf, last, name, err);
    if (rc) return rc;
    if (!shape_rows(e0, 1)) return ckv_add_same(J->b, name, i, err);
    size_t src[LAY_MAX_PARTS];
    int64_t total = 0;
    for (int p = 0; p < F->n_part; p++) {
        if ((rc = nmap_glob_rewrite(F->part[0], F->part[p], fqn, pf, sizeof pf, err)) ||
            (rc = lay_full_name(J, 0, k, pf, last, pn, err)))
            return rc;
        long j = ckpt_find(J->src, pn);
        const ckpt_entry *e = j >= 0 ? ckpt_entry_at(J->src, (size_t)j) : NULL;
        if (!e || !shape_rows(e, 1))
            return fsdp_err_set(err, FSDP_E_INVALID, "layout %s fuses %s from %s, which the checkpoint lacks", J->L->name,
                                name, pn);
        src[p] = (size_t)j;
        total += e->shape[0];
    }
    pair *pp = pairs(J, (size_t)total, err);
    if (!pp) return err->code;
    int64_t rows0 = 0, hd = 0;
    size_t n = 0;
    for (int p = 0; p < F->n_part; p++) {
        const ckpt_entry *e = ckpt_entry_at(J->src, src[p]);
        int64_t rows;
        if ((rc = part_rows(J, F, p, total, &rows, &hd, name, err))) return rc;
        if (rows != e->shape[0])
            return fsdp_err_set(err, FSDP_E_INVALID, "layout %s: %s has %lld rows where fusing %s wants %lld",
                                J->L->name, e->name, (long long)e->shape[0], name, (long long)rows);
        if (p == 0) rows0 = rows;
        (void)nmap_glob_rewrite(F->part[0], F->part[p], fqn, pf, sizeof pf, err);
        int heads = qk_heads(J, pf);
        if (heads < 0) return need_heads(J, e->name, err);
        for (int64_t u = 0; u < rows; u++)
            pp[n++] = (pair){src[p], rope_row(J, rows, heads, u), fused_row(J, F, p, u, rows0, hd)};
    }
    int64_t shape[FSDP_MAX_DIMS];
    memcpy(shape, e0->shape, sizeof shape);
    shape[0] = total;
    return add_pairs(J, name, e0->ndim, shape, n, err);
}

static unsigned fuse_flag(kkind k) { return k == K_WEIGHT ? LAY_FUSE_WEIGHTS : LAY_FUSE_MOMENTS; }

static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static int to_canon(job *J, size_t i, kkind k, const char *fqn, const char *last, fsdp_err *err) {
    const lay_layout *L = J->L;
    if (k == K_OPTION && L->groups == LAY_GROUPS_INDEXED) return lay_group_to_canon(J, i, fqn, last, err);
    if (k == K_MOMENT && L->ids == LAY_IDS_MODULE_ORDER && all_digits(fqn)) {
        const char *name = lay_id_name(J, strtol(fqn, NULL, 10));
        if (!*name)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: optimizer state of parameter id %s, and the checkpoint has %zu "
                                "parameters (layout %s)", ckpt_entry_at(J->src, i)->name, fqn, J->n_ids, L->name);
        fqn = name;
    }
    for (size_t f = 0; f < L->n_fuse; f++)
        if ((L->fuse[f].what & fuse_flag(k)) && nmap_glob_match(L->fuse[f].native, fqn, NULL) >= 0)
            return split_fused(J, i, &L->fuse[f], k, fqn, last, err);
    char cf[1][NAME_CAP], name[NAME_CAP];
    int n, rc = lay_canon_fqns(J, fqn, 0, cf, &n, err);
    if (!rc) rc = lay_full_name(J, 0, k, cf[0], last, name, err);
    return rc ? rc : add_renamed(J, i, name, cf[0], err);
}

static int from_canon(job *J, size_t i, kkind k, const char *fqn, const char *last, fsdp_err *err) {
    const lay_layout *L = J->L;
    if (k == K_OPTION && L->groups == LAY_GROUPS_INDEXED) return 0; /* lay_groups_from_canon, after the keys */
    for (size_t f = 0; f < L->n_fuse; f++) {
        const lay_fuse *F = &L->fuse[f];
        if (!(F->what & fuse_flag(k))) continue;
        if (nmap_glob_match(F->part[0], fqn, NULL) >= 0) return join_fused(J, i, F, k, fqn, last, err);
        for (int p = 1; p < F->n_part; p++)
            if (nmap_glob_match(F->part[p], fqn, NULL) >= 0) return 0; /* joined with its part 0 */
    }
    char nf[NAME_CAP], name[NAME_CAP];
    int secondary, rc = lay_native_fqn(J, fqn, 0, nf, &secondary, err);
    if (!rc && k == K_MOMENT && L->ids == LAY_IDS_MODULE_ORDER) {
        long id = lay_name_id(J, nf);
        if (id < 0)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: optimizer state of %s, which the checkpoint's model lacks (layout "
                                "%s keys it by the parameter's id)", ckpt_entry_at(J->src, i)->name, nf, L->name);
        snprintf(nf, sizeof nf, "%ld", id);
    }
    if (!rc) rc = lay_full_name(J, 1, k, nf, last, name, err);
    return rc ? rc : add_renamed(J, i, name, fqn, err);
}

/* FROM_CANON: one of fsdp-run's training entries the layout does not keep */
static int left_out(const job *J, const char *key) {
    if (J->dir != LAY_FROM_CANON || !lay_canon_extra(key)) return 0;
    for (size_t k = 0; k < J->L->n_extra; k++)
        if (nmap_glob_match(J->L->extra[k], key, NULL) >= 0) return 0;
    return 1;
}

static int one_key(job *J, size_t i, size_t *omitted, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(J->src, i);
    char fqn[NAME_CAP], last[128];
    int native = J->dir == LAY_TO_CANON;
    if (left_out(J, e->name)) {
        const char *vp = J->L->values_prefix; /* kept in the layout's values file (lay_side_write), not lost */
        if (!vp || strncmp(e->name, vp, strlen(vp))) ++*omitted;
        return 0;
    }
    kkind k = lay_classify(J, native, e->name, fqn, last);
    if (k == K_OTHER) return ckv_add_same(J->b, e->name, i, err);
    return native ? to_canon(J, i, k, fqn, last, err) : from_canon(J, i, k, fqn, last, err);
}

int lay_view(ckpt_reader *src, int own, const lay_layout *L, lay_dir dir, const lay_facts *f, ckpt_reader **out,
             size_t *omitted, fsdp_err *err) {
    *out = NULL;
    size_t none_left = 0;
    if (!omitted) omitted = &none_left;
    *omitted = 0;
    lay_facts none = {0, 0, NULL, NULL, 0};
    job J = {src, L, dir, f ? f : &none, NULL, NULL, 0, NULL, 0};
    int rc = ckv_new(src, own, &J.b, err);
    if (rc) {
        if (own) ckpt_close(src);
        return rc;
    }
    rc = lay_ids_build(&J, err);
    for (size_t i = 0; i < ckpt_count(src) && !rc; i++) rc = one_key(&J, i, omitted, err);
    if (!rc && dir == LAY_FROM_CANON && L->groups == LAY_GROUPS_INDEXED) rc = lay_groups_from_canon(&J, err);
    if (!rc) rc = lay_side_read(&J, err);
    free(J.p);
    lay_ids_free(&J);
    if (rc) {
        ckv_free(J.b);
        return rc;
    }
    rc = ckv_finish(J.b, out, err);
    return rc ? fsdp_err_prefix(err, "layout %s", L->name) : 0;
}
