/* sio_hf_facts, sio_parts_*, sio_part_local (state_load_parts.h). */
#include "ckpt/state_load_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sio_hf_facts(const fsdp_state *s, nmap_hf *hf) {
    memset(hf, 0, sizeof *hf);
    hf->n_heads = s->hf.n_heads;
    hf->n_kv_heads = s->hf.n_kv_heads;
    hf->qk_norm_full = s->hf_moe.qk_norm_full;
    hf->mixtral = s->hf_moe.moe_style == STATE_HF_MOE_MIXTRAL;
    hf->mla = state_find((fsdp_state *)s, "layers.0.attention.wkv_a.weight") != NULL;
}

int sio_parts_init(sio_parts *pp, size_t nparams, fsdp_err *err) {
    pp->n = nparams;
    pp->seen = calloc(nparams ? nparams : 1, sizeof *pp->seen);
    return pp->seen ? 0 : fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
}

void sio_parts_free(sio_parts *pp) {
    for (size_t i = 0; pp->seen && i < pp->n; i++) free(pp->seen[i]);
    free(pp->seen);
    pp->seen = NULL;
}

int sio_parts_mark(sio_parts *pp, size_t i, int64_t nparts, int part, int *complete, fsdp_err *err) {
    *complete = 0;
    if (!pp->seen[i] && !(pp->seen[i] = calloc((size_t)(nparts ? nparts : 1), 1)))
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    pp->seen[i][part] = 1;
    int64_t k = 0;
    while (k < nparts && pp->seen[i][k]) k++;
    *complete = k == nparts;
    return 0;
}

static void add(char *buf, size_t cap, const char *text) {
    size_t l = strlen(buf);
    if (l + 8 >= cap) return;
    snprintf(buf + l, cap - l, "%s", text);
}

int sio_parts_report(const sio_parts *pp, size_t i, const state_param *p, const nmap_hf *hf, char *problems,
                     size_t cap) {
    char first[NMAP_NAME_MAX], line[NMAP_NAME_MAX * 2 + 200];
    fsdp_err e;
    if (p->ndim < 1 || nmap_stack_part_name(p->name, 0, hf, first, sizeof first, &e)) return 0;
    int64_t nparts = p->shape[0], missing = 0;
    const unsigned char *seen = pp->seen[i];
    for (int64_t k = 0; k < nparts; k++) missing += !seen || !seen[k];
    char shp[128];
    snprintf(line, sizeof line, "\n  %s %s not restored: %lld of its %lld experts missing in the checkpoint",
             p->name, fsdp_shape_str(p->ndim, p->shape, shp, sizeof shp), (long long)missing, (long long)nparts);
    add(problems, cap, line);
    int shown = 0;
    for (int64_t k = 0; k < nparts; k++) {
        if (seen && seen[k]) continue;
        if (shown++ == 8) {
            add(problems, cap, " ...");
            break;
        }
        char name[NMAP_NAME_MAX];
        if (nmap_stack_part_name(p->name, (int)k, hf, name, sizeof name, &e)) break;
        snprintf(line, sizeof line, "%s%s", shown == 1 ? ": " : ", ", name);
        add(problems, cap, line);
    }
    return 1;
}

void sio_part_local(const state_param *p, int part, int64_t *lo, int64_t *hi, size_t *dst_off) {
    int64_t f = p->ndim >= 2 ? p->shape[1] : 1, sub = f ? p->row_numel / f : 0;
    int64_t a = p->row0 * f, b = (p->row0 + p->rows) * f, pa = (int64_t)part * f, pb = pa + f;
    int64_t x = a > pa ? a : pa, y = b < pb ? b : pb;
    *lo = x < y ? x - pa : 0;
    *hi = x < y ? y - pa : 0;
    *dst_off = x < y ? (size_t)((x - a) * sub) : 0;
}
