/* Integer ids of parameters in the model's module order (layouts/layout.h, LAY_IDS_MODULE_ORDER). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/lay_view_impl.h"

typedef struct ranked {
    char *name;
    long section, layer, row; /* 0 before the layers, 1 a layer's, 2 after them; the layer; the rule */
    size_t idx;               /* lay_module_order: its index in the caller's list */
} ranked;

/* Where the trainer's name fqn stands in the module order: its rule of L's name table (-1: none). */
static int rank_of(const lay_layout *L, const char *fqn, ranked *out) {
    int first_layer_rule = -1;
    for (size_t r = 0; r < L->n_names; r++) {
        int layered = strchr(L->names[r].native, '*') != NULL;
        if (layered && first_layer_rule < 0) first_layer_rule = (int)r;
        nmap_span caps[NMAP_MAX_CAPTURES];
        if (nmap_glob_match(L->names[r].native, fqn, caps) < 0) continue;
        out->row = (long)r;
        out->layer = layered ? strtol(fqn + caps[0].off, NULL, 10) : 0;
        out->section = layered ? 1 : first_layer_rule < 0 ? 0 : 2;
        return 0;
    }
    return -1;
}

static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->section != y->section) return x->section < y->section ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

int lay_module_order(const lay_layout *L, const char *const *names, size_t n, size_t *order, fsdp_err *err) {
    ranked *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (rank_of(L, names[i], &v[i]))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "layout %s: %s is no parameter it knows the place of", L->name, names[i]);
        v[i].idx = i;
    }
    if (!rc) qsort(v, n, sizeof *v, cmp_ranked);
    for (size_t i = 0; i < n && !rc; i++) order[i] = v[i].idx;
    free(v);
    return rc;
}

int lay_ids_build(lay_job *J, fsdp_err *err) {
    if (J->L->ids != LAY_IDS_MODULE_ORDER) return 0;
    size_t n = ckpt_count(J->src), k = 0;
    ranked *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = 0, native = J->dir == LAY_TO_CANON;
    for (size_t i = 0; i < n && !rc; i++) {
        const ckpt_entry *e = ckpt_entry_at(J->src, i);
        char fqn[LAY_NAME_CAP], last[128], nf[LAY_NAME_CAP];
        if (!e->is_tensor || lay_classify(J, native, e->name, fqn, last) != LAY_K_WEIGHT) continue;
        int secondary = 0;
        if (!native && (rc = lay_native_fqn(J, fqn, 0, nf, &secondary, err))) break;
        const char *name = native ? fqn : nf;
        if (rank_of(J->L, name, &v[k]))
            rc = fsdp_err_set(err, FSDP_E_INVALID, "layout %s keys its optimizer state by parameter id in module order, "
                              "and %s is no parameter it knows the place of", J->L->name, e->name);
        else if (!(v[k].name = strdup(name))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
        else k++;
    }
    if (!rc) {
        qsort(v, k, sizeof *v, cmp_ranked);
        if (!(J->id_name = calloc(k ? k : 1, sizeof *J->id_name))) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < k; i++) {
        if (!rc) J->id_name[i] = v[i].name;
        else free(v[i].name);
    }
    if (!rc) J->n_ids = k;
    free(v);
    return rc;
}

void lay_ids_free(lay_job *J) {
    for (size_t i = 0; i < J->n_ids; i++) free(J->id_name[i]);
    free(J->id_name);
    J->id_name = NULL, J->n_ids = 0;
}

const char *lay_id_name(const lay_job *J, long i) { return i >= 0 && (size_t)i < J->n_ids ? J->id_name[i] : ""; }

long lay_name_id(const lay_job *J, const char *native_fqn) {
    for (size_t i = 0; i < J->n_ids; i++)
        if (!strcmp(J->id_name[i], native_fqn)) return (long)i;
    return -1;
}
