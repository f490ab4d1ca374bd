/* safetensors reader: one tensor object {"dtype", "shape", "data_offsets"} and the __metadata__
 * object of a header, read token by token (safetensors_json.h) and validated like the reference
 * reader (safetensors/src/tensor.rs: TensorInfo, Metadata::validate). Keys may come in any order;
 * a key given twice is an error, as in any JSON object of the header; other keys of a tensor
 * object are read (any JSON value) and ignored, as serde does. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors_internal.h"
#include "ckpt/safetensors_json.h"
#include "runtime/checked.h"
#include "runtime/name_index.h"

enum { SEEN_DTYPE = 1, SEEN_SHAPE = 2, SEEN_OFFSETS = 4 };

typedef struct entry {
    const char *name;
    unsigned seen;
    uint64_t begin, end;
    nidx other; /* the other keys, for duplicates */
} entry;

static int bad(const stj *j, const entry *e, size_t at, fsdp_err *err, const char *what) {
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': %s (header byte %zu)", j->path, e->name, what, at);
}

static int read_dtype(stj *j, entry *e, st_tensor_info *t, fsdp_err *err) {
    size_t at = j->pos;
    if (stj_peek(j) != '"') return bad(j, e, at, err, "\"dtype\" must be a string");
    const char *ds;
    int rc = stj_string(j, &ds, err);
    if (rc) return rc;
    t->dtype = st_dtype_parse(ds);
    if (t->dtype != FSDP_DT_INVALID) return FSDP_OK;
    if (st_dtype_is_foreign(ds))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': safetensors dtype '%s' is not supported by fsdp-run",
                            j->path, e->name, ds);
    return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': unknown dtype '%s'", j->path, e->name, ds);
}

/* A non-negative integer array element at the cursor (after ws); *ok 0 when it is something else. */
static int read_uint(stj *j, uint64_t *v, int *ok, fsdp_err *err) {
    *ok = 0;
    int c = stj_peek(j), rc = stj_need(j, err);
    if (rc) return rc;
    if (c != '-' && !(c >= '0' && c <= '9')) return FSDP_OK;
    stj_numkind kind;
    rc = stj_number(j, v, &kind, err);
    *ok = !rc && kind == STJ_UINT;
    return rc;
}

static int read_shape(stj *j, entry *e, st_tensor_info *t, fsdp_err *err) {
    if (stj_peek(j) != '[') return bad(j, e, j->pos, err, "\"shape\" must be an array of integers");
    j->pos++;
    size_t nd = 0;
    if (stj_peek(j) == ']') {
        j->pos++;
    } else {
        for (;;) {
            size_t at = j->pos;
            uint64_t d;
            int ok, rc = read_uint(j, &d, &ok, err);
            if (rc) return rc;
            if (!ok)
                return fsdp_err_set(err, FSDP_E_FORMAT,
                                    "%s: tensor '%s': shape[%zu] must be a non-negative integer (header byte %zu)",
                                    j->path, e->name, nd, at);
            if (nd < FSDP_MAX_DIMS) t->shape[nd] = (int64_t)d;
            nd++;
            int closed;
            if ((rc = stj_sep(j, ']', &closed, "in the shape of tensor", e->name, err))) return rc;
            if (closed) break;
        }
    }
    if (nd > FSDP_MAX_DIMS)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d supported)", j->path,
                            e->name, nd, FSDP_MAX_DIMS);
    t->ndim = (int)nd;
    return FSDP_OK;
}

static int read_offsets(stj *j, entry *e, fsdp_err *err) {
    static const char *const what = "\"data_offsets\" must be [begin, end] with non-negative integers";
    size_t at = j->pos;
    int ok = 0, rc = FSDP_OK;
    if (stj_peek(j) == '[') {
        j->pos++;
        rc = read_uint(j, &e->begin, &ok, err);
        if (!rc && ok && (ok = stj_peek(j) == ',')) {
            j->pos++;
            rc = read_uint(j, &e->end, &ok, err);
            if (!rc && ok && (ok = stj_peek(j) == ']')) j->pos++;
        }
    }
    if (rc) return rc;
    return ok ? FSDP_OK : bad(j, e, at, err, what);
}

/* One "key": value of a tensor object (the cursor on the key's quote). */
static int read_member(stj *j, entry *e, st_tensor_info *t, fsdp_err *err) {
    size_t at = j->pos;
    const char *k;
    int rc = stj_string(j, &k, err);
    if (!rc) rc = stj_expect(j, ':', "':'", err);
    if (!rc) rc = stj_need(j, err);
    if (rc) return rc;
    unsigned bit = !strcmp(k, "dtype") ? SEEN_DTYPE : !strcmp(k, "shape") ? SEEN_SHAPE
                                                    : !strcmp(k, "data_offsets") ? SEEN_OFFSETS : 0;
    if (bit && (e->seen & bit)) return stj_fail(j, at, err, "duplicate key \"%s\" in tensor '%s'", k, e->name);
    e->seen |= bit;
    switch (bit) {
    case SEEN_DTYPE: return read_dtype(j, e, t, err);
    case SEEN_SHAPE: return read_shape(j, e, t, err);
    case SEEN_OFFSETS: return read_offsets(j, e, err);
    default: break;
    }
    int dup = nidx_add(&e->other, k, 0, NULL);
    if (dup < 0) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", j->path);
    if (dup) return stj_fail(j, at, err, "duplicate key \"%s\" in tensor '%s'", k, e->name);
    return stj_skip_value(j, err);
}

static int read_members(stj *j, entry *e, st_tensor_info *t, fsdp_err *err) {
    if (stj_peek(j) == '}') {
        j->pos++;
        return FSDP_OK;
    }
    for (;;) {
        if (stj_peek(j) != '"') return stj_fail(j, j->pos, err, "a key (string) expected in tensor '%s'", e->name);
        int closed = 0, rc = read_member(j, e, t, err);
        if (!rc) rc = stj_sep(j, '}', &closed, "in tensor", e->name, err);
        if (rc || closed) return rc;
    }
}

/* What the whole object must satisfy: every key there, end >= begin, size = shape x dtype. */
static int check_entry(const stj *j, const entry *e, st_tensor_info *t, fsdp_err *err) {
    const char *p = j->path, *name = e->name, *ds = fsdp_dtype_st_name(t->dtype);
    if (!(e->seen & SEEN_DTYPE)) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': missing \"dtype\"", p, name);
    if (!(e->seen & SEEN_SHAPE)) return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': missing \"shape\"", p, name);
    if (!(e->seen & SEEN_OFFSETS))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", p, name);
    if (e->end < e->begin)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", p,
                            name, (unsigned long long)e->begin, (unsigned long long)e->end);
    int64_t nb;
    char sb[256];
    if (chk_shape_bytes(t->ndim, t->shape, fsdp_dtype_size(t->dtype), &nb))
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: tensor '%s': corrupt header: shape %s of %s overflows (more than 2^63 bytes)", p,
                            name, fsdp_shape_str(t->ndim, t->shape, sb, sizeof sb), ds);
    if (e->end - e->begin != (uint64_t)nb)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: tensor '%s': corrupt header: shape %s of %s needs %llu bytes but data_offsets "
                            "[%llu, %llu] hold %llu",
                            p, name, fsdp_shape_str(t->ndim, t->shape, sb, sizeof sb), ds, (unsigned long long)nb,
                            (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)(e->end - e->begin));
    return FSDP_OK;
}

int st_int_parse_entry(stj *j, const st_file *f, st_tensor_info *t, fsdp_err *err) {
    entry e;
    memset(&e, 0, sizeof e);
    e.name = t->name;
    if (stj_peek(j) != '{') return bad(j, &e, j->pos, err, "entry must be an object");
    j->pos++;
    size_t mark = j->used; /* the keys and the dtype string are not kept */
    int rc = read_members(j, &e, t, err);
    nidx_free(&e.other);
    j->used = mark;
    if (rc) return rc;
    if ((rc = check_entry(j, &e, t, err))) return rc;
    t->nbytes = e.end - e.begin;
    t->offset = f->data_start + e.begin;
    return FSDP_OK;
}

/* One "key": "value" of __metadata__ (the cursor on the key's quote), kept in f->meta. */
static int read_meta_member(stj *j, st_file *f, size_t *cap, nidx *keys, fsdp_err *err) {
    size_t at = j->pos;
    const char *k, *v;
    int rc = stj_string(j, &k, err);
    if (!rc) rc = stj_expect(j, ':', "':'", err);
    if (!rc) rc = stj_need(j, err);
    if (rc) return rc;
    int dup = nidx_add(keys, k, f->nmeta, NULL);
    if (dup < 0) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for __metadata__", j->path);
    if (dup) return stj_fail(j, at, err, "duplicate key \"%s\" in __metadata__", k);
    if (stj_peek(j) != '"')
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: __metadata__ value of '%s' must be a string (nested JSON, numbers and null are not "
                            "allowed) (header byte %zu)",
                            j->path, k, j->pos);
    if ((rc = stj_string(j, &v, err))) return rc;
    if (f->nmeta == *cap) {
        size_t nc = *cap ? 2 * *cap : 8;
        char **m = (char **)realloc(f->meta, 2 * nc * sizeof *m);
        if (!m) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for __metadata__", j->path);
        f->meta = m;
        *cap = nc;
    }
    f->meta[2 * f->nmeta] = (char *)k;
    f->meta[2 * f->nmeta + 1] = (char *)v;
    f->nmeta++;
    return FSDP_OK;
}

int st_int_parse_metadata(stj *j, st_file *f, fsdp_err *err) {
    int c = stj_peek(j);
    if (c != '{')
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: __metadata__ must be an object of strings, got %s (header byte %zu)", j->path,
                            c == '[' ? "an array" : "a scalar", j->pos);
    j->pos++;
    if (stj_peek(j) == '}') {
        j->pos++;
        return FSDP_OK;
    }
    nidx keys;
    nidx_init(&keys);
    size_t cap = 0;
    int rc, closed = 0;
    do {
        if (stj_peek(j) != '"') rc = stj_fail(j, j->pos, err, "a key (string) expected in __metadata__");
        else rc = read_meta_member(j, f, &cap, &keys, err);
        if (!rc) rc = stj_sep(j, '}', &closed, "in __metadata__", NULL, err);
    } while (!rc && !closed);
    nidx_free(&keys);
    return rc;
}
