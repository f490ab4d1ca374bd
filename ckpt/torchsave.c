/* torch.save archives read and written (ckpt/torchsave.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/torchsave.h"

static const struct {
    const char *cls;
    fsdp_dtype dt;
} STORAGES[] = {{"FloatStorage", FSDP_DT_F32},  {"DoubleStorage", FSDP_DT_F64}, {"HalfStorage", FSDP_DT_F16},
                {"BFloat16Storage", FSDP_DT_BF16}, {"CharStorage", FSDP_DT_I8},  {"ByteStorage", FSDP_DT_U8},
                {"ShortStorage", FSDP_DT_I16},  {"IntStorage", FSDP_DT_I32},    {"LongStorage", FSDP_DT_I64},
                {"BoolStorage", FSDP_DT_BOOL},  {"ComplexFloatStorage", FSDP_DT_C64},
                {"ComplexDoubleStorage", FSDP_DT_C128}};

const char *ts_storage_class(fsdp_dtype dt) {
    for (size_t i = 0; i < sizeof STORAGES / sizeof *STORAGES; i++)
        if (STORAGES[i].dt == dt) return STORAGES[i].cls;
    return NULL;
}

fsdp_dtype ts_storage_dtype(const char *cls) {
    for (size_t i = 0; i < sizeof STORAGES / sizeof *STORAGES; i++)
        if (!strcmp(STORAGES[i].cls, cls)) return STORAGES[i].dt;
    return FSDP_DT_INVALID;
}

int ts_tensor_from_pickle(const pkl_obj *o, const char *what, ts_tensor *t, fsdp_err *err) {
    memset(t, 0, sizeof *t);
    if (!o || o->kind != PKL_REDUCE || !o->fn)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: not a tensor (expected torch._utils._rebuild_tensor_v2)", what);
    return ts_tensor_from_call(o->fn, o->args, what, t, err);
}

/* nn.Parameter: _rebuild_parameter(data, requires_grad, hooks[, state]); a tensor subclass:
 * torch._tensor._rebuild_from_type_v2(func, type, args, state) */
int ts_tensor_unwrap(const pkl_obj *o, const pkl_obj **fn, const pkl_obj **args) {
    for (int hops = 0; o && o->kind == PKL_REDUCE && o->args && o->args->kind == PKL_TUPLE && hops < 4; hops++) {
        if ((pkl_is_global(o->fn, "torch._utils", "_rebuild_tensor_v2") ||
             pkl_is_global(o->fn, "torch._utils", "_rebuild_tensor_v3"))) {
            *fn = o->fn;
            *args = o->args;
            return 1;
        }
        if ((pkl_is_global(o->fn, "torch._utils", "_rebuild_parameter") ||
             pkl_is_global(o->fn, "torch._utils", "_rebuild_parameter_with_state")) &&
            o->args->n >= 1) {
            o = o->args->items[0];
            continue;
        }
        if (pkl_is_global(o->fn, "torch._tensor", "_rebuild_from_type_v2") && o->args->n >= 3 &&
            o->args->items[2]->kind == PKL_TUPLE &&
            (pkl_is_global(o->args->items[0], "torch._utils", "_rebuild_tensor_v2") ||
             pkl_is_global(o->args->items[0], "torch._utils", "_rebuild_tensor_v3"))) {
            *fn = o->args->items[0];
            *args = o->args->items[2];
            return 1;
        }
        return 0;
    }
    return 0;
}

int ts_tensor_from_call(const pkl_obj *fn, const pkl_obj *args, const char *what, ts_tensor *t, fsdp_err *err) {
    memset(t, 0, sizeof *t);
    int v3 = pkl_is_global(fn, "torch._utils", "_rebuild_tensor_v3");
    if (!v3 && !pkl_is_global(fn, "torch._utils", "_rebuild_tensor_v2")) {
        const pkl_obj *g = fn;
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: unsupported tensor rebuild function %s.%s", what,
                            g && g->kind == PKL_GLOBAL ? g->s : "?", g && g->kind == PKL_GLOBAL ? g->name : "?");
    }
    const pkl_obj *a = args;
    if (!a || a->kind != PKL_TUPLE || a->n < 4 || (v3 && a->n < 7))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: malformed tensor rebuild arguments", what);
    const pkl_obj *st = a->items[0];
    if (st->kind != PKL_PERSID || !st->args || st->args->kind != PKL_TUPLE || st->args->n < 5)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor storage is not a persistent id", what);
    const pkl_obj *pid = st->args;
    if (pid->items[0]->kind != PKL_STR || strcmp(pid->items[0]->s, "storage"))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: persistent id is not a storage", what);
    const pkl_obj *cls = pid->items[1], *key = pid->items[2], *numel = pid->items[4];
    if (key->kind != PKL_STR || key->len >= sizeof t->key || numel->kind != PKL_INT || numel->i < 0)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: malformed storage id", what);
    memcpy(t->key, key->s, key->len + 1);
    size_t esz = 1;
    if (v3) {
        const pkl_obj *dtg = a->items[6];
        if (dtg->kind != PKL_GLOBAL || strcmp(dtg->s, "torch"))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: _rebuild_tensor_v3 without a torch dtype", what);
        t->dtype = fsdp_dtype_from_name(dtg->name);
        if (!t->dtype) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: unsupported dtype torch.%s", what, dtg->name);
        esz = fsdp_dtype_size(t->dtype);
        if (!pkl_is_global(cls, "torch.storage", "UntypedStorage") && !pkl_is_global(cls, "torch", "UntypedStorage"))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: _rebuild_tensor_v3 storage must be UntypedStorage", what);
        if (numel->i % (int64_t)esz)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: storage of %lld bytes is not whole %s elements", what,
                                (long long)numel->i, fsdp_dtype_name(t->dtype));
        t->storage_numel = numel->i / (int64_t)esz;
    } else {
        if (cls->kind != PKL_GLOBAL || strcmp(cls->s, "torch"))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: unknown storage class", what);
        for (size_t i = 0; i < sizeof STORAGES / sizeof *STORAGES; i++)
            if (!strcmp(cls->name, STORAGES[i].cls)) t->dtype = STORAGES[i].dt;
        if (!t->dtype) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: unsupported storage class torch.%s", what, cls->name);
        t->storage_numel = numel->i;
    }
    if (a->items[1]->kind != PKL_INT || a->items[1]->i < 0)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: bad storage offset", what);
    t->storage_offset = a->items[1]->i;
    int nd = 0, ns = 0;
    if (pkl_int_tuple(a->items[2], t->shape, FSDP_MAX_DIMS, &nd) || pkl_int_tuple(a->items[3], t->stride, FSDP_MAX_DIMS, &ns) ||
        nd != ns)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: bad tensor size/stride", what);
    t->ndim = nd;
    int64_t numel_t = 1, maxoff = t->storage_offset;
    for (int d = 0; d < nd; d++) {
        if (t->shape[d] < 0 || t->stride[d] < 0)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: negative size or stride", what);
        if (__builtin_mul_overflow(numel_t, t->shape[d], &numel_t))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: the tensor's size overflows 64 bits", what);
    }
    for (int d = 0; d < nd && numel_t > 0; d++) {
        int64_t reach;
        if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &reach) ||
            __builtin_add_overflow(maxoff, reach, &maxoff))
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: the tensor's strides overflow 64 bits", what);
    }
    if (numel_t > 0 && maxoff >= t->storage_numel)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: size/stride/offset reach element %lld of a %lld-element storage",
                            what, (long long)maxoff, (long long)t->storage_numel);
    t->numel = numel_t;
    /* bytes: the storage's (its elements lie in it, checked above); a view whose strides repeat
     * elements (a broadcast, stride 0) reads fewer bytes than it returns, but what it returns
     * must still fit 64 bits */
    uint64_t sb, tb;
    esz = fsdp_dtype_size(t->dtype);
    if (__builtin_mul_overflow((uint64_t)t->storage_numel, (uint64_t)esz, &sb) ||
        __builtin_mul_overflow((uint64_t)numel_t, (uint64_t)esz, &tb))
        t->need = UINT64_MAX;
    else
        t->need = sb;
    return 0;
}

int ts_check_record(zip_reader *z, const ts_tensor *t, const char *name, fsdp_err *err) {
    char rec[80], who[200];
    snprintf(rec, sizeof rec, "data/%s", t->key);
    if (name) snprintf(who, sizeof who, "tensor %s", name);
    else snprintf(who, sizeof who, "the tensor in record %s", rec);
    zip_entry *e = zip_find(z, rec);
    if (!e) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: %s: missing record %s", z->what, who, rec);
    if (e->bad) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s", who, e->bad);
    if (t->need <= e->size) return 0;
    char need[48];
    if (t->need == UINT64_MAX) snprintf(need, sizeof need, "more than %llu", (unsigned long long)UINT64_MAX);
    else snprintf(need, sizeof need, "%llu", (unsigned long long)t->need);
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: corrupt: %s needs %s bytes, the record has %llu (%s)", z->what, who,
                        need, (unsigned long long)e->size, e->name);
}

int ts_load_pickle(zip_reader *z, pkl_doc **doc, const pkl_obj **root, fsdp_err *err) {
    zip_entry *e = zip_find(z, "data.pkl");
    if (!e) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: no data.pkl record (not a torch.save archive)", z->what);
    void *buf;
    size_t len;
    int rc = zip_read_all(z, e, &buf, &len, err);
    if (rc) return rc;
    char what[512];
    snprintf(what, sizeof what, "%s data.pkl", z->what);
    rc = pkl_parse(buf, len, what, doc, root, err);
    free(buf);
    return rc;
}

int ts_load_tensor(zip_reader *z, const char *name, ts_tensor *t, fsdp_err *err) {
    pkl_doc *doc;
    const pkl_obj *root;
    int rc = ts_load_pickle(z, &doc, &root, err);
    if (rc) return rc;
    rc = ts_tensor_from_pickle(root, z->what, t, err);
    pkl_free(doc);
    return rc ? rc : ts_check_record(z, t, name, err);
}

/* Gathers the box (off, len: n elements) of the storage bytes tmp (which start at element lo). */
static void gather(const ts_tensor *t, const int64_t *off, const int64_t *len, int64_t n, int64_t lo,
                   const unsigned char *tmp, unsigned char *g) {
    size_t esz = fsdp_dtype_size(t->dtype);
    int64_t idx[FSDP_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t so = t->storage_offset - lo;
        for (int d = 0; d < t->ndim; d++) so += (off[d] + idx[d]) * t->stride[d];
        memcpy(g + (size_t)k * esz, tmp + (size_t)so * esz, esz);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < len[d]) break;
            idx[d] = 0;
        }
    }
}

int ts_read_box(zip_reader *z, const ts_tensor *t, const int64_t *off, const int64_t *len, void *dst,
                fsdp_dtype dst_dt, fsdp_err *err) {
    return ts_read_box_nan(z, t, off, len, dst, dst_dt, NULL, err);
}

int ts_read_box_nan(zip_reader *z, const ts_tensor *t, const int64_t *off, const int64_t *len, void *dst,
                    fsdp_dtype dst_dt, int *nan, fsdp_err *err) {
    if (nan) *nan = 0;
    int rc = ts_check_record(z, t, NULL, err);
    if (rc) return rc;
    char rec[80];
    snprintf(rec, sizeof rec, "data/%s", t->key);
    zip_entry *e = zip_find(z, rec);
    size_t esz = fsdp_dtype_size(t->dtype);
    /* the box's bytes fit 64 bits (checked when t was decoded); the storage range it spans is
     * at most the storage's bytes (t->need <= the record's size) */
    int64_t n = 1, lo = t->storage_offset, hi = t->storage_offset;
    int whole = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (off[d] < 0 || len[d] < 0 || off[d] > t->shape[d] || len[d] > t->shape[d] - off[d])
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: box outside the tensor", z->what);
        if (off[d] != 0 || len[d] != t->shape[d]) whole = 0;
        n *= len[d];
    }
    if (n == 0) return 0;
    for (int d = 0; d < t->ndim; d++) {
        lo += off[d] * t->stride[d];
        hi += (off[d] + len[d] - 1) * t->stride[d];
    }
    size_t span = (size_t)(hi - lo + 1) * esz;
    uint64_t at = (uint64_t)lo * esz;
    /* contiguous box in storage: read straight into a buffer of the right layout */
    int contiguous = 1;
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0 && contiguous; d--) {
        if (len[d] == 1) continue;
        if (t->stride[d] != expect) contiguous = 0;
        expect = t->stride[d] * len[d];
    }
    if (contiguous && span == (size_t)n * esz) {
        /* straight into dst, converted and checked on the way (ckpt_pread.h) */
        ckpt_rd_xf xf = {(size_t)n, t->dtype, dst_dt, 0, nan != NULL, 0, 0};
        rc = zip_read_xf(z, e, at, dst, &xf, whole, err);
        if (!rc && nan) *nan = xf.nan;
        return rc;
    }
    /* general strides: read the spanned storage once, gather element by element */
    unsigned char *tmp = malloc(span);
    unsigned char *g = malloc((size_t)n * esz);
    if (!tmp || !g) {
        free(tmp);
        free(g);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", z->what);
    }
    rc = whole ? zip_read_checked(z, e, at, tmp, span, err) : zip_read(z, e, at, tmp, span, err);
    if (!rc) {
        gather(t, off, len, n, lo, tmp, g);
        rc = fsdp_convert(dst, dst_dt, g, t->dtype, (size_t)n, err);
        if (!rc && nan && dst_dt == FSDP_DT_F32) *nan = ckpt_f32_has_nan(dst, (size_t)n);
    }
    free(tmp);
    free(g);
    return rc;
}

/* payloads from this size on are written by zip_writer_data_par */
#define TS_PAR_BYTES ((uint64_t)1 << 20)

/* ---- writing ------------------------------------------------------------------------ */

static int write_common(zip_writer *zw, const void *pkl, size_t n, fsdp_err *err) {
    int rc = zip_writer_add(zw, "archive/data.pkl", pkl, n, err);
    if (!rc) rc = zip_writer_add(zw, "archive/byteorder", "little", 6, err);
    return rc;
}

void ts_w_tensor_ref(pkl_w *w, fsdp_dtype dt, int ndim, const int64_t *shape, const char *key) {
    int64_t numel = fsdp_numel(ndim, shape);
    size_t esz = fsdp_dtype_size(dt);
    const char *cls = ts_storage_class(dt);
    pkl_w_global(w, "torch._utils", cls ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    pkl_w_mark(w);
    pkl_w_mark(w);
    pkl_w_str(w, "storage");
    if (cls) pkl_w_global(w, "torch", cls);
    else pkl_w_global(w, "torch.storage", "UntypedStorage");
    pkl_w_str(w, key);
    pkl_w_str(w, "cpu");
    pkl_w_int(w, cls ? numel : numel * (int64_t)esz);
    pkl_w_tuple(w);
    pkl_w_binpersid(w);
    pkl_w_int(w, 0);
    int64_t stride[FSDP_MAX_DIMS];
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d] ? shape[d] : 1;
    }
    pkl_w_int_tuple(w, shape, ndim);
    pkl_w_int_tuple(w, stride, ndim);
    pkl_w_bool(w, 0);
    pkl_w_global(w, "collections", "OrderedDict");
    pkl_w_empty_tuple(w);
    pkl_w_reduce(w);
    if (!cls) pkl_w_global(w, "torch", fsdp_dtype_torch_name(dt));
    pkl_w_tuple(w);
    pkl_w_reduce(w);
}

int ts_write_tensor(FILE *f, fsdp_dtype dt, int ndim, const int64_t *shape, const void *data, ts_fill_fn fill,
                    void *user, uint64_t *len, fsdp_err *err) {
    int64_t numel = fsdp_numel(ndim, shape);
    if (numel < 0) return fsdp_err_set(err, FSDP_E_INVALID, "torch.save: invalid shape");
    size_t esz = fsdp_dtype_size(dt);
    pkl_w w;
    pkl_w_init(&w);
    pkl_w_proto(&w, 2);
    ts_w_tensor_ref(&w, dt, ndim, shape, "0");
    pkl_w_stop(&w);
    if (w.oom) {
        pkl_w_free(&w);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    zip_writer zw;
    int rc = zip_writer_begin(&zw, f, err);
    if (!rc) rc = write_common(&zw, w.buf, w.len, err);
    pkl_w_free(&w);
    uint64_t bytes = (uint64_t)numel * esz;
    if (!rc) rc = zip_writer_start(&zw, "archive/data/0", bytes, err);
    /* large payloads: parallel positional writes (the same bytes) */
    if (!rc && data)
        rc = bytes >= TS_PAR_BYTES ? zip_writer_data_par(&zw, data, (size_t)bytes, err)
                                   : zip_writer_data(&zw, data, (size_t)bytes, err);
    else if (!rc)
        rc = fill(user, &zw, err);
    if (!rc) rc = zip_writer_end_record(&zw, err);
    if (!rc) rc = zip_writer_add(&zw, "archive/version", "3\n", 2, err);
    if (!rc) rc = zip_writer_finish(&zw, len, err);
    zip_writer_free(&zw);
    return rc;
}

int ts_write_value(FILE *f, const void *pickle, size_t n, uint64_t *len, fsdp_err *err) {
    return ts_write_value_named(f, "archive", pickle, n, len, err);
}

int ts_write_value_named(FILE *f, const char *archive, const void *pickle, size_t n, uint64_t *len, fsdp_err *err) {
    char rec[3][512];
    if (snprintf(rec[0], sizeof rec[0], "%s/data.pkl", archive) >= (int)sizeof rec[0])
        return fsdp_err_set(err, FSDP_E_INVALID, "torch.save: archive name %.64s... too long", archive);
    snprintf(rec[1], sizeof rec[1], "%s/byteorder", archive);
    snprintf(rec[2], sizeof rec[2], "%s/version", archive);
    zip_writer zw;
    int rc = zip_writer_begin(&zw, f, err);
    if (!rc) rc = zip_writer_add(&zw, rec[0], pickle, n, err);
    if (!rc) rc = zip_writer_add(&zw, rec[1], "little", 6, err);
    if (!rc) rc = zip_writer_add(&zw, rec[2], "3\n", 2, err);
    if (!rc) rc = zip_writer_finish(&zw, len, err);
    zip_writer_free(&zw);
    return rc;
}
