/* ckpt convert of mixture-of-experts checkpoints (cli/ckpt_convert_moe.h). */
#include "cli/ckpt_convert_moe.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "ckpt/ckpt_stream_out.h"

/* --hf-config: the facts config.json gives */
static int facts_from_config(const char *path, int *heads, int *kv_heads, nmap_hf *hf, fsdp_err *err) {
    char file[4200];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    json_error_t je;
    json_t *j = json_load_file(file, 0, &je);
    if (!j) return fsdp_err_set(err, FSDP_E_INVALID, "--hf-config %s: cannot read %s: %s", path, file, je.text);
    const char *mt = json_string_value(json_object_get(j, "model_type"));
    int rc = 0;
    if (!json_is_object(j) || !mt) {
        rc = fsdp_err_set(err, FSDP_E_INVALID, "--hf-config %s: %s has no model_type (expected a Hugging Face config.json)",
                          path, file);
    } else {
        hf->mixtral = !strcmp(mt, "mixtral");
        hf->qk_norm_full = !strcmp(mt, "olmoe") || !strcmp(mt, "olmo2");
        hf->mla = !strcmp(mt, "deepseek_v3") || !strcmp(mt, "deepseek_v2");
        json_t *h = json_object_get(j, "num_attention_heads"), *kv = json_object_get(j, "num_key_value_heads");
        if (*heads <= 0 && json_is_integer(h)) *heads = (int)json_integer_value(h);
        if (*kv_heads <= 0 && json_is_integer(kv)) *kv_heads = (int)json_integer_value(kv);
    }
    json_decref(j);
    return rc;
}

/* 1 when some q_norm of r is as long as its q projection has rows (a norm over the whole projection) */
static int full_qk_norm(ckpt_reader *r) {
    const char *suf = "q_norm.weight";
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        size_t n = strlen(e->name), sl = strlen(suf);
        if (!e->is_tensor || e->ndim != 1 || n <= sl || strcmp(e->name + n - sl, suf)) continue;
        char q[1100];
        int hf = n > strlen("self_attn.q_norm.weight") && strstr(e->name, "self_attn.q_norm.weight");
        snprintf(q, sizeof q, "%.*s%s", (int)(n - sl), e->name, hf ? "q_proj.weight" : "wq.weight");
        long qi = ckpt_find(r, q);
        if (qi < 0) continue;
        const ckpt_entry *w = ckpt_entry_at(r, (size_t)qi);
        return w->ndim == 2 && w->shape[0] == e->shape[0];
    }
    return 0;
}

int ckcv_facts(ckpt_reader *r, int heads, int kv_heads, const char *hf_config, const char *moe_names, nmap_hf *hf,
               fsdp_err *err) {
    memset(hf, 0, sizeof *hf);
    if (hf_config) {
        int rc = facts_from_config(hf_config, &heads, &kv_heads, hf, err);
        if (rc) return rc;
    }
    if (moe_names) hf->mixtral = !strcmp(moe_names, "mixtral");
    for (size_t i = 0; i < ckpt_count(r); i++) {
        const char *n = ckpt_entry_at(r, i)->name;
        if (!moe_names && strstr(n, "block_sparse_moe.")) hf->mixtral = 1;
        if (strstr(n, "self_attn.kv_a_proj_with_mqa.") || strstr(n, "attention.wkv_a.")) hf->mla = 1;
    }
    if (!hf->qk_norm_full) hf->qk_norm_full = full_qk_norm(r);
    hf->n_heads = heads;
    hf->n_kv_heads = kv_heads > 0 ? kv_heads : heads;
    return 0;
}

int ckcv_stacks_add(ckcv_stacks *st, ckpt_reader *r, const char *tt, int part, size_t i, size_t new_pos, int *is_new,
                    size_t *pos, fsdp_err *err) {
    ckcv_stack *g = NULL;
    *is_new = 0;
    for (size_t k = st->n; k-- > 0 && !g;) /* the parts of one tensor are usually neighbours */
        if (!strcmp(st->g[k].tt, tt)) g = &st->g[k];
    if (!g) {
        if (st->n == st->cap) {
            size_t cap = st->cap ? st->cap * 2 : 16;
            ckcv_stack *ng = realloc(st->g, cap * sizeof *ng);
            if (!ng) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
            st->g = ng;
            st->cap = cap;
        }
        g = &st->g[st->n];
        memset(g, 0, sizeof *g);
        if (!(g->tt = strdup(tt))) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        st->n++;
        g->pos = new_pos;
        *is_new = 1;
    }
    *pos = g->pos;
    if ((size_t)part >= g->cap) {
        size_t cap = g->cap ? g->cap : 8;
        while (cap <= (size_t)part) cap *= 2;
        size_t *ns = realloc(g->src, cap * sizeof *ns);
        if (!ns) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        for (size_t k = g->cap; k < cap; k++) ns[k] = SIZE_MAX;
        g->src = ns;
        g->cap = cap;
    }
    if (g->src[part] != SIZE_MAX)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s and %s are both expert %d of %s", ckpt_entry_at(r, g->src[part])->name,
                            ckpt_entry_at(r, i)->name, part, tt);
    g->src[part] = i;
    if ((size_t)part + 1 > g->n) g->n = (size_t)part + 1;
    return 0;
}

int ckcv_stacks_finish(ckcv_stacks *st, ckpt_reader *r, const nmap_hf *hf, ckrs_entry *e, fsdp_err *err) {
    for (size_t k = 0; k < st->n; k++) {
        ckcv_stack *g = &st->g[k];
        const ckpt_entry *first = NULL;
        for (size_t q = 0; q < g->n; q++) {
            if (g->src[q] == SIZE_MAX) {
                char name[NMAP_NAME_MAX];
                fsdp_err e2;
                if (nmap_stack_part_name(g->tt, (int)q, hf, name, sizeof name, &e2)) snprintf(name, sizeof name, "?");
                return fsdp_err_set(err, FSDP_E_INVALID,
                                    "%s: expert %zu of its %zu is missing (the checkpoint has no %s)", g->tt, q, g->n,
                                    name);
            }
            const ckpt_entry *x = ckpt_entry_at(r, g->src[q]);
            if (!first) {
                first = x;
                continue;
            }
            if (x->ndim != first->ndim || memcmp(x->shape, first->shape, (size_t)x->ndim * sizeof *x->shape) ||
                x->dtype != first->dtype) {
                char a[128], b[128];
                return fsdp_err_set(err, FSDP_E_INVALID, "%s: its experts differ: %s is %s %s, %s is %s %s", g->tt,
                                    first->name, fsdp_dtype_name(first->dtype), fsdp_shape_str(first->ndim, first->shape, a, sizeof a),
                                    x->name, fsdp_dtype_name(x->dtype), fsdp_shape_str(x->ndim, x->shape, b, sizeof b));
            }
        }
        if (first->ndim + 1 > FSDP_MAX_DIMS)
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: a stack of %d-d experts has too many dims", g->tt, first->ndim);
        ckrs_entry *x = &e[g->pos];
        x->i = g->src[0];
        x->parts = g->src;
        x->nparts = g->n;
        x->ndim = first->ndim + 1;
        x->shape[0] = (int64_t)g->n;
        memcpy(x->shape + 1, first->shape, (size_t)first->ndim * sizeof *first->shape);
    }
    return 0;
}

void ckcv_stacks_free(ckcv_stacks *st) {
    for (size_t k = 0; k < st->n; k++) {
        free(st->g[k].tt);
        free(st->g[k].src);
    }
    free(st->g);
    memset(st, 0, sizeof *st);
}

int ckcv_st_declare(ckpt_reader *r, size_t i, const char *tt, const nmap_hf *hf, const char *add, fsdp_dtype dt,
                    st_writer *w, size_t **idx, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, i);
    if (e->ndim < 1)
        return fsdp_err_set(err, FSDP_E_INVALID, "%s is a stack of experts and is 0-d (expected [experts, ...])", e->name);
    *idx = calloc((size_t)e->shape[0] + 1, sizeof **idx);
    if (!*idx) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0;
    for (int64_t q = 0; q < e->shape[0] && !rc; q++) {
        char part[NMAP_NAME_MAX], name[NMAP_NAME_MAX + 256];
        if ((rc = nmap_stack_part_name(tt, (int)q, hf, part, sizeof part, err))) break;
        snprintf(name, sizeof name, "%s%s", add ? add : "", part);
        rc = st_writer_declare(w, name, dt, e->ndim - 1, e->shape + 1, &(*idx)[q], err);
    }
    return rc;
}

int ckcv_st_write(ckpt_reader *r, size_t i, fsdp_dtype dt, st_writer *w, const size_t *idx, int stream,
                  ckcv_read_fn read, void *user, const char *what, uint64_t *bytes, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, i);
    int64_t parts = e->shape[0];
    size_t part_bytes = (size_t)fsdp_numel(e->ndim - 1, e->shape + 1) * fsdp_dtype_size(dt);
    cks_files fc = {0};
    cks_src s;
    int ok = 0, rc = stream ? cks_src_resolve(r, i, &fc, &s, &ok, err) : 0;
    if (!rc && ok) {
        cks_opts o;
        cks_opts_default(&o);
        for (int64_t q = 0; q < parts && !rc; q++) rc = cks_rows_to_st(&s, q, q + 1, dt, w, idx[q], what, &o, err);
        cks_src_free(&s);
    } else if (!rc) {
        void *buf = NULL;
        rc = read(user, i, dt, &buf, err);
        for (int64_t q = 0; q < parts && !rc; q++)
            rc = st_writer_write(w, idx[q], (const char *)buf + (size_t)q * part_bytes, part_bytes, err);
        free(buf);
    }
    cks_files_free(&fc);
    if (!rc) *bytes += (uint64_t)parts * part_bytes;
    return rc;
}
