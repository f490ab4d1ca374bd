/* safetensors reader: mapping one file and validating its header like the reference reader
 * (safetensors/src/tensor.rs: read_metadata + Metadata::validate), plus duplicate keys. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"
#include "runtime/fileio.h"
#include "runtime/checked.h"

typedef struct {
    const char *name; /* borrowed from the JSON tree */
    fsdp_dtype dtype;
    int ndim;
    int64_t shape[FSDP_MAX_DIMS];
    uint64_t begin, end;
} entry;

static int cmp_entry(const void *a, const void *b) {
    const entry *x = (const entry *)a, *y = (const entry *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int get_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0) return -1;
    *out = (uint64_t)i;
    return 0;
}

static int parse_metadata(st_file *f, const json_t *m, fsdp_err *err) {
    if (!json_is_object(m))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: __metadata__ must be an object of strings, got %s",
                            f->path, json_is_array(m) ? "an array" : "a scalar");
    size_t n = json_object_size(m);
    if (n == 0) return FSDP_OK;
    f->meta = (char **)calloc(2 * n, sizeof(char *));
    if (!f->meta) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for __metadata__", f->path);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: __metadata__ value of '%s' must be a string (nested JSON, numbers "
                                "and null are not allowed)",
                                f->path, k);
        f->meta[2 * f->nmeta] = strdup(k);
        f->meta[2 * f->nmeta + 1] = strdup(json_string_value(v));
        f->nmeta++;
        if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
            return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for __metadata__", f->path);
    }
    return FSDP_OK;
}

static int parse_entry(const st_file *f, const char *name, const json_t *v, entry *e, fsdp_err *err) {
    const char *p = f->path;
    e->name = name;
    if (!json_is_object(v))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': entry must be an object", p, name);
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    if (!dt || !json_is_string(dt))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': %s", p, name,
                            dt ? "\"dtype\" must be a string" : "missing \"dtype\"");
    const char *ds = json_string_value(dt);
    e->dtype = st_dtype_parse(ds);
    if (e->dtype == FSDP_DT_INVALID) {
        if (st_dtype_is_foreign(ds))
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: tensor '%s': safetensors dtype '%s' is not supported by fsdp-run", p,
                                name, ds);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': unknown dtype '%s'", p, name, ds);
    }
    if (!sh || !json_is_array(sh))
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': %s", p, name,
                            sh ? "\"shape\" must be an array of integers" : "missing \"shape\"");
    size_t nd = json_array_size(sh);
    if (nd > FSDP_MAX_DIMS)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d supported)",
                            p, name, nd, FSDP_MAX_DIMS);
    e->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (get_uint(json_array_get(sh, i), &d))
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: tensor '%s': shape[%zu] must be a non-negative integer", p, name, i);
        e->shape[i] = (int64_t)d;
    }
    if (!off || !json_is_array(off) || json_array_size(off) != 2 ||
        get_uint(json_array_get(off, 0), &e->begin) || get_uint(json_array_get(off, 1), &e->end))
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: tensor '%s': %s", p, name,
                            off ? "\"data_offsets\" must be [begin, end] with non-negative integers"
                                : "missing \"data_offsets\"");
    if (e->end < e->begin)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin",
                            p, name, (unsigned long long)e->begin, (unsigned long long)e->end);
    int64_t nb;
    if (chk_shape_bytes(e->ndim, e->shape, fsdp_dtype_size(e->dtype), &nb)) {
        char sb[256];
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: tensor '%s': corrupt header: shape %s of %s overflows (more than 2^63 bytes)", p,
                            name, fsdp_shape_str(e->ndim, e->shape, sb, sizeof sb), ds);
    }
    uint64_t nbytes = (uint64_t)nb;
    if (e->end - e->begin != nbytes) {
        char sb[256];
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: tensor '%s': corrupt header: shape %s of %s needs %llu bytes but data_offsets "
                            "[%llu, %llu] hold %llu",
                            p, name, fsdp_shape_str(e->ndim, e->shape, sb, sizeof sb), ds,
                            (unsigned long long)nbytes, (unsigned long long)e->begin,
                            (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
    }
    return FSDP_OK;
}

/* Sorted entries must tile [0, last_end) and the buffer must end at the end of the file. */
static int check_tiling(const st_file *f, const entry *es, size_t n, uint64_t header_len, fsdp_err *err) {
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (es[i].begin > pos)
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: tensor '%s': data_offsets [%llu, %llu] leave a hole of %llu bytes %s%s%s "
                                "(offsets must tile the data buffer)",
                                f->path, es[i].name, (unsigned long long)es[i].begin,
                                (unsigned long long)es[i].end, (unsigned long long)(es[i].begin - pos),
                                i ? "after tensor '" : "at the start of the buffer", i ? es[i - 1].name : "",
                                i ? "'" : "");
        if (es[i].begin < pos)
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
                                f->path, es[i].name, (unsigned long long)es[i].begin,
                                (unsigned long long)es[i].end, es[i - 1].name,
                                (unsigned long long)es[i - 1].begin, (unsigned long long)es[i - 1].end);
        pos = es[i].end;
    }
    uint64_t avail = (uint64_t)f->size - 8 - header_len;
    if (pos != avail)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: the tensors cover %llu bytes of data but the file holds %llu after the "
                            "header (%s)",
                            f->path, (unsigned long long)pos, (unsigned long long)avail,
                            pos < avail ? "trailing bytes" : "file truncated");
    return FSDP_OK;
}

static int map_file(st_file *f, fsdp_err *err) {
    int fd;
    int rc = fio_open_read(f->path, NULL, &fd, err); /* never blocks on a FIFO */
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fsdp_err_set(err, FSDP_E_IO, "%s: cannot stat: %s", f->path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_IO, "%s: not a regular file", f->path);
    }
    if (st.st_size < 8) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: file is %lld bytes, too short for the 8-byte header length (truncated?)",
                            f->path, (long long)st.st_size);
    }
    f->size = (size_t)st.st_size;
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return fsdp_err_set(err, FSDP_E_IO, "%s: mmap failed: %s", f->path, strerror(e));
    f->map = (unsigned char *)m;
    return FSDP_OK;
}

static int grow_tensors(st_reader *r, size_t extra, fsdp_err *err) {
    if (r->nt + extra <= r->tcap) return FSDP_OK;
    size_t cap = r->tcap ? r->tcap : 64;
    while (cap < r->nt + extra) {
        if (cap > SIZE_MAX / 2 / sizeof(st_tensor_info))
            return fsdp_err_set(err, FSDP_E_NOMEM, "too many tensors");
        cap *= 2;
    }
    st_tensor_info *t = (st_tensor_info *)realloc(r->t, cap * sizeof *t);
    if (!t) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for the tensor list");
    r->t = t;
    r->tcap = cap;
    return FSDP_OK;
}

static int parse_header(st_reader *r, st_file *f, size_t fidx, fsdp_err *err) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];
    if (n > ST_MAX_HEADER_SIZE)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: header length %llu exceeds the safetensors limit of %llu bytes (not a "
                            "safetensors file?)",
                            f->path, (unsigned long long)n, (unsigned long long)ST_MAX_HEADER_SIZE);
    if (n > f->size - 8)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                            f->path, (unsigned long long)n, f->size);
    f->data_start = 8 + n;
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: invalid JSON header: %s (header byte %d)", f->path,
                            je.text, je.position);
    int rc = FSDP_OK;
    entry *es = NULL;
    size_t ne = 0;
    if (!json_is_object(root)) {
        rc = fsdp_err_set(err, FSDP_E_FORMAT, "%s: JSON header is not an object", f->path);
        goto out;
    }
    es = (entry *)calloc(json_object_size(root) + 1, sizeof *es);
    if (!es) {
        rc = fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory for the header", f->path);
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "__metadata__"))
            rc = parse_metadata(f, v, err);
        else
            rc = parse_entry(f, k, v, &es[ne++], err);
        if (rc) goto out;
    }
    qsort(es, ne, sizeof *es, cmp_entry);
    if ((rc = check_tiling(f, es, ne, n, err))) goto out;
    if ((rc = grow_tensors(r, ne, err))) goto out;
    for (size_t i = 0; i < ne; i++) {
        st_tensor_info *t = &r->t[r->nt];
        memset(t, 0, sizeof *t);
        t->name = strdup(es[i].name);
        if (!t->name) {
            rc = fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", f->path);
            goto out;
        }
        t->dtype = es[i].dtype;
        t->ndim = es[i].ndim;
        memcpy(t->shape, es[i].shape, sizeof t->shape);
        t->nbytes = es[i].end - es[i].begin;
        t->offset = f->data_start + es[i].begin;
        t->file = fidx;
        r->nt++;
    }
out:
    free(es);
    json_decref(root);
    return rc;
}

int st_int_add_file(st_reader *r, const char *path, fsdp_err *err) {
    st_file *fs = (st_file *)realloc(r->files, (r->nfiles + 1) * sizeof *fs);
    if (!fs) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    r->files = fs;
    st_file *f = &fs[r->nfiles];
    memset(f, 0, sizeof *f);
    r->nfiles++; /* from here on st_close frees whatever f holds */
    f->path = strdup(path);
    if (!f->path) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    int rc = map_file(f, err);
    if (!rc) rc = parse_header(r, f, r->nfiles - 1, err);
    return rc;
}

static int cmp_name(const void *a, const void *b, void *ctx) {
    const st_tensor_info *t = (const st_tensor_info *)ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

int st_int_finalize(st_reader *r, fsdp_err *err) {
    free(r->by_name);
    r->by_name = (size_t *)malloc((r->nt ? r->nt : 1) * sizeof(size_t));
    if (!r->by_name) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory for the tensor index");
    for (size_t i = 0; i < r->nt; i++) r->by_name[i] = i;
    qsort_r(r->by_name, r->nt, sizeof(size_t), cmp_name, r->t);
    for (size_t i = 1; i < r->nt; i++) {
        const st_tensor_info *a = &r->t[r->by_name[i - 1]], *b = &r->t[r->by_name[i]];
        if (!strcmp(a->name, b->name))
            return fsdp_err_set(err, FSDP_E_FORMAT, "duplicate tensor '%s': in %s and in %s", a->name,
                                r->files[a->file].path, r->files[b->file].path);
    }
    return FSDP_OK;
}

char *st_int_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    while (a > 1 && dir[a - 1] == '/') a--;
    int sep = a > 0 && dir[a - 1] != '/';
    char *s = (char *)malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    if (sep) s[a] = '/';
    memcpy(s + a + sep, name, b + 1);
    return s;
}
