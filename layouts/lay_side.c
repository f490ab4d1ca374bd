/* A layout's side file of plain values (layouts/layout.h, lay_side: fms-fsdp's metadata.pth, OLMo's train.pt) and
 * its values file (lay_layout.values_file: accelerate's scheduler.bin). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/dcp_side.h"
#include "ckpt/pickle.h"
#include "ckpt/pt_write.h"
#include "layouts/lay_view_impl.h"

static int int_pickle(pkl_w *w, int64_t v) {
    pkl_w_init(w);
    pkl_w_proto(w, 2);
    pkl_w_int(w, v);
    pkl_w_stop(w);
    return w->oom;
}

/* The values file (lay_layout.values_file) into the view under values_prefix, unless the checkpoint has them. */
static int values_read(lay_job *J, fsdp_err *err) {
    const lay_layout *L = J->L;
    if (!L->values_file || J->dir != LAY_TO_CANON || !J->f->dir) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", J->f->dir, L->values_file);
    FILE *probe = fopen(path, "rb");
    if (!probe) return 0; /* a job without a scheduler */
    fclose(probe);
    ckpt_reader *r;
    int rc = ckpt_open(path, CKPT_PT, &r, err);
    if (rc) return fsdp_err_prefix(err, "layout %s", L->name);
    for (size_t i = 0; i < ckpt_count(r) && !rc; i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        char key[LAY_NAME_CAP];
        snprintf(key, sizeof key, "%s%s", L->values_prefix, e->name);
        if (e->is_tensor) {
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s is a tensor (layout %s keeps plain values there)", path, e->name,
                              L->name);
            break;
        }
        if (ckpt_find(J->src, key) >= 0) continue; /* the checkpoint's own wins */
        void *buf;
        size_t len;
        const char *text = NULL;
        if ((rc = ckpt_value_pickle(r, i, &buf, &len, err))) break;
        if (!(rc = ckpt_value(r, i, &text, err))) rc = ckv_add_value(J->b, key, buf, len, text, err);
        free(buf);
    }
    ckpt_close(r);
    return rc;
}

static int values_write(const lay_layout *L, ckpt_reader *r, const char *dir, fsdp_err *err) {
    if (!L->values_file) return 0;
    size_t n = 0, plen = strlen(L->values_prefix);
    for (size_t i = 0; i < ckpt_count(r); i++) n += !strncmp(ckpt_entry_at(r, i)->name, L->values_prefix, plen);
    if (!n) return 0;
    char path[4400], arch[128];
    snprintf(path, sizeof path, "%s/%s", dir, L->values_file);
    snprintf(arch, sizeof arch, "%s", L->values_file);
    char *dot = strrchr(arch, '.');
    if (dot) *dot = '\0';
    ptw_file *t;
    int rc = ptw_begin(path, arch, &t, err);
    if (rc) return rc;
    pkl_w *w = ptw_pickle(t);
    pkl_w_empty_dict(w);
    pkl_w_mark(w);
    for (size_t i = 0; i < ckpt_count(r) && !rc; i++) {
        const ckpt_entry *e = ckpt_entry_at(r, i);
        if (strncmp(e->name, L->values_prefix, plen)) continue;
        if (e->is_tensor) {
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s is a tensor: layout %s keeps plain values in %s", e->name, L->name,
                              L->values_file);
            break;
        }
        pkl_w_str(w, e->name + plen);
        rc = ptw_value_from(t, r, i, err);
    }
    pkl_w_setitems(w);
    if (rc) {
        ptw_abort(t);
        return rc;
    }
    return ptw_finish(t, err);
}

int lay_side_read(lay_job *J, fsdp_err *err) {
    int vrc = values_read(J, err);
    if (vrc) return vrc;
    const lay_side *sd = J->L->side;
    if (!sd || sd->write_only || J->dir != LAY_TO_CANON || !J->f->dir) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", J->f->dir, sd->file);
    FILE *probe = fopen(path, "rb");
    if (!probe) return 0; /* the checkpoint alone: no train state */
    fclose(probe);
    ckpt_reader *r;
    int rc = ckpt_open(path, CKPT_PT, &r, err);
    if (rc) return fsdp_err_prefix(err, "layout %s", J->L->name);
    for (int k = 0; k < sd->n && !rc; k++) {
        long i = ckpt_find(r, sd->key[k]);
        int64_t v;
        if (i < 0 || ckpt_value_int(r, (size_t)i, &v)) {
            rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: no integer '%s' (layout %s keeps %s there)", path, sd->key[k],
                              J->L->name, sd->canon[k]);
            break;
        }
        if (ckpt_find(J->src, sd->canon[k]) >= 0) continue; /* the checkpoint's own wins */
        pkl_w w;
        char text[32];
        snprintf(text, sizeof text, "%lld", (long long)v);
        rc = int_pickle(&w, v) ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory")
                               : ckv_add_value(J->b, sd->canon[k], w.buf, w.len, text, err);
        pkl_w_free(&w);
    }
    ckpt_close(r);
    return rc;
}

/* The value of canonical entry `name`, else (train_state.step) the first optimizer step, else 0. */
static int64_t canon_int(ckpt_reader *r, const char *name) {
    int64_t v = 0;
    long i = ckpt_find(r, name);
    if (i >= 0 && !ckpt_value_int(r, (size_t)i, &v)) return v;
    if (strcmp(name, "train_state.step")) return 0;
    for (size_t k = 0; k < ckpt_count(r); k++) {
        const ckpt_entry *e = ckpt_entry_at(r, k);
        size_t n = strlen(e->name);
        if (e->is_tensor && e->ndim == 0 && n > 5 && !strcmp(e->name + n - 5, ".step") &&
            !strncmp(e->name, LAY_CANON_OPTIM "state.", strlen(LAY_CANON_OPTIM "state."))) {
            double d = 0;
            fsdp_err ignored;
            if (!ckpt_read_rows(r, k, 0, 1, &d, FSDP_DT_F64, &ignored)) return (int64_t)(d + 0.5);
        }
    }
    return 0;
}

int lay_side_write(const lay_layout *L, ckpt_reader *r, const char *dir, fsdp_err *err) {
    int vrc = values_write(L, r, dir, err);
    if (vrc) return vrc;
    const lay_side *sd = L->side;
    if (!sd) return 0;
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    pkl_w_empty_dict(&w);
    pkl_w_mark(&w);
    for (int k = 0; k < sd->n; k++) {
        pkl_w_str(&w, sd->key[k]);
        pkl_w_int(&w, canon_int(r, sd->canon[k]));
    }
    for (int k = 0; k < sd->n_empty; k++) {
        pkl_w_str(&w, sd->empty_list[k]);
        pkl_w_empty_list(&w);
    }
    pkl_w_setitems(&w);
    pkl_w_stop(&w);
    int rc = w.oom ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : dcp_side_write(dir, sd->file, w.buf, w.len, err);
    pkl_w_free(&w);
    return rc;
}
