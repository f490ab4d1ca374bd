/* A model table from a checkpoint header (see mt_ckpt.h). */
#include "model/mt_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/namemap.h"

int mt_ckpt_is_bookkeeping(const char *key) {
    static const char *const pre[] = {"optimizer.", "train_state.", "lr_scheduler.", "dataloader.", NULL};
    for (const char *const *p = pre; *p; p++)
        if (!strncmp(key, *p, strlen(*p))) return 1;
    return 0;
}

const char *mt_ckpt_strip(const char *key, const char *const *strip, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *r = nmap_strip_prefix(key, strip[i] ? strip[i] : "");
        if (r) return r;
    }
    return NULL;
}

/* Index of the first glob matching key, -1 when none. */
static long glob_hit(const char *const *globs, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (globs[i] && nmap_glob_match(globs[i], key, NULL) >= 0) return (long)i;
    return -1;
}

/* One checkpoint entry as a parameter of the part (*added: 1 when it became one). */
static int add_entry(mt_table *t, int part, const char *path, const ckpt_entry *e, const mt_ckpt_opts *o,
                     size_t *keys_hit, size_t *excl_hit, int *added, fsdp_err *err) {
    *added = 0;
    if (!e->is_tensor || mt_ckpt_is_bookkeeping(e->name)) return 0;
    const char *key = o->n_strip ? mt_ckpt_strip(e->name, o->strip, o->n_strip) : e->name;
    if (!key) return 0;
    long k = glob_hit(o->exclude, o->n_exclude, key);
    if (k >= 0) {
        excl_hit[k]++;
        return 0;
    }
    if (o->n_keys || o->keys_given) {
        k = glob_hit(o->keys, o->n_keys, key);
        if (k < 0) return 0;
        keys_hit[k]++;
    }
    /* an fp8 weight converted to a float dtype reads dequantised by its block scales (ckpt/reader_st.c),
     * which are then no parameters of their own */
    if (e->fp8_scale && o->dtype) return 0;
    int fp8 = e->dtype == FSDP_DT_F8_E4M3FN || e->dtype == FSDP_DT_F8_E5M2;
    fsdp_dtype dt = o->dtype ? o->dtype : e->dtype;
    if (o->dtype && !fsdp_dtype_is_float(e->dtype) && !fp8)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: %s: tensor %s is %s, which does not convert to %s", path,
                            e->name, fsdp_dtype_name(e->dtype), fsdp_dtype_name(o->dtype));
    if (dt != FSDP_DT_F32 && dt != FSDP_DT_BF16 && dt != FSDP_DT_F16)
        return fsdp_err_set(err, FSDP_E_INVALID,
                            "model: %s: tensor %s is %s; a parameter is f32, bf16 or f16 (exclude it, or set dtype to "
                            "convert it)",
                            path, e->name, fsdp_dtype_name(e->dtype));
    char name[MT_NAME_MAX + 2];
    int w = snprintf(name, sizeof name, "%s%s", t->parts[part].prefix, key);
    if (w < 0 || (size_t)w >= sizeof name)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: %s: the name of tensor %.64s... is longer than %d bytes", path,
                            e->name, MT_NAME_MAX);
    mt_param p;
    memset(&p, 0, sizeof p);
    p.name = name;
    p.ndim = e->ndim;
    memcpy(p.shape, e->shape, sizeof p.shape);
    p.dtype = dt;
    p.init = o->init;
    p.part = part;
    p.layer = -1;
    int rc = mt_add(t, &p, err);
    if (!rc) *added = 1;
    return rc;
}

/* A keys / exclude glob that matched nothing. */
static int unused_glob(const char *path, const char *what, const char *const *globs, const size_t *hits, size_t n,
                       fsdp_err *err) {
    for (size_t i = 0; i < n; i++)
        if (!hits[i])
            return fsdp_err_set(err, FSDP_E_INVALID, "model: %s: %s glob '%s' matches no tensor of the checkpoint", path,
                                what, globs[i]);
    return 0;
}

int mt_ckpt_add(mt_table *t, int part, const char *path, const mt_ckpt_opts *o, fsdp_err *err) {
    if (part < 0 || (size_t)part >= t->n_parts)
        return fsdp_err_set(err, FSDP_E_INVALID, "model: part %d does not exist", part);
    ckpt_reader *r;
    int rc = ckpt_open(path, o->format, &r, err);
    if (rc) return rc;
    size_t *keys_hit = calloc(o->n_keys + 1, sizeof *keys_hit), *excl_hit = calloc(o->n_exclude + 1, sizeof *excl_hit);
    if (!keys_hit || !excl_hit) rc = fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    size_t added = 0;
    for (size_t i = 0; !rc && i < ckpt_count(r); i++) {
        int a;
        rc = add_entry(t, part, path, ckpt_entry_at(r, i), o, keys_hit, excl_hit, &a, err);
        added += (size_t)a;
    }
    if (!rc) rc = unused_glob(path, "keys", o->keys, keys_hit, o->n_keys, err);
    if (!rc) rc = unused_glob(path, "exclude", o->exclude, excl_hit, o->n_exclude, err);
    if (!rc && !added)
        rc = fsdp_err_set(err, FSDP_E_INVALID, "model: %s (%s checkpoint) holds no tensor for the model%s%s", path,
                          ckpt_format_name(ckpt_reader_format(r)), o->n_strip ? " under the prefix " : "",
                          o->n_strip ? o->strip[0] : "");
    free(keys_hit);
    free(excl_hit);
    ckpt_close(r);
    return rc;
}
