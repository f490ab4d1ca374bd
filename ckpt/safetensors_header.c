/* safetensors reader: mapping one file and validating its header like the reference reader
 * (safetensors/src/tensor.rs: read_metadata + Metadata::validate), plus duplicate keys. The
 * header is read in one pass without a JSON tree (safetensors_json.h, safetensors_entry.c): its
 * tensors go straight into the reader's table and their names into one arena per file, so that
 * a header of millions of tensors costs a small multiple of its own size. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors_internal.h"
#include "ckpt/safetensors_json.h"
#include "runtime/fileio.h"

/* A file's tensors, in data-offset order, must tile [0, last_end) of its data buffer, and the
 * buffer must end at the end of the file. */
static int check_tiling(const st_file *f, const st_tensor_info *t, fsdp_err *err) {
    uint64_t pos = 0, ds = f->data_start;
    for (size_t i = 0; i < f->nt; i++) {
        uint64_t b = t[i].offset - ds, e = b + t[i].nbytes;
        if (b > pos)
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: tensor '%s': data_offsets [%llu, %llu] leave a hole of %llu bytes %s%s%s "
                                "(offsets must tile the data buffer)",
                                f->path, t[i].name, (unsigned long long)b, (unsigned long long)e,
                                (unsigned long long)(b - pos), i ? "after tensor '" : "at the start of the buffer",
                                i ? t[i - 1].name : "", i ? "'" : "");
        if (b < pos)
            return fsdp_err_set(err, FSDP_E_FORMAT,
                                "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
                                f->path, t[i].name, (unsigned long long)b, (unsigned long long)e, t[i - 1].name,
                                (unsigned long long)(t[i - 1].offset - ds),
                                (unsigned long long)(t[i - 1].offset - ds + t[i - 1].nbytes));
        pos = e;
    }
    uint64_t avail = (uint64_t)f->size - ds;
    if (pos != avail)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: the tensors cover %llu bytes of data but the file holds %llu after the "
                            "header (%s)",
                            f->path, (unsigned long long)pos, (unsigned long long)avail,
                            pos < avail ? "trailing bytes" : "file truncated");
    return FSDP_OK;
}

static int map_file(st_reader *r, st_file *f, const char *rel, fsdp_err *err) {
    int fd;
    int rc = rel && r->dfd >= 0 ? fio_open_beneath(r->dfd, r->dir, rel, &fd, err)
                                : fio_open_read(f->path, NULL, &fd, err); /* never blocks on a FIFO */
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
    if (m == MAP_FAILED) {
        close(fd);
        return fsdp_err_set(err, FSDP_E_IO, "%s: mmap failed: %s", f->path, strerror(e));
    }
    f->map = (unsigned char *)m;
    f->fd = fd;
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

/* Data-offset order: begin, then end (nbytes), then name. */
static int cmp_offset(const st_tensor_info *x, const st_tensor_info *y) {
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_offset_idx(const void *a, const void *b, void *ctx) {
    const st_tensor_info *t = (const st_tensor_info *)ctx;
    return cmp_offset(&t[*(const size_t *)a], &t[*(const size_t *)b]);
}

/* Puts t[0, n) in data-offset order: a sorted index (8 bytes a tensor), then the permutation
 * applied in place, cycle by cycle (a header is most often in that order already). */
static int sort_by_offset(st_tensor_info *t, size_t n, const char *path, fsdp_err *err) {
    size_t i = 1;
    while (i < n && cmp_offset(&t[i - 1], &t[i]) <= 0) i++;
    if (i >= n) return FSDP_OK;
    size_t *p = (size_t *)malloc(n * sizeof *p);
    if (!p) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory sorting %zu tensors", path, n);
    for (i = 0; i < n; i++) p[i] = i;
    qsort_r(p, n, sizeof *p, cmp_offset_idx, t);
    for (i = 0; i < n; i++) { /* position k takes t[p[k]]; a placed position gets p[k] = k */
        if (p[i] == i) continue;
        st_tensor_info tmp = t[i];
        size_t k = i;
        while (p[k] != i) {
            size_t from = p[k];
            t[k] = t[from];
            p[k] = k;
            k = from;
        }
        t[k] = tmp;
        p[k] = k;
    }
    free(p);
    return FSDP_OK;
}

/* The key at the cursor: __metadata__ (once) or a tensor appended to r. */
static int parse_member(st_reader *r, st_file *f, size_t fidx, stj *j, int *have_meta, fsdp_err *err) {
    size_t at = j->pos, mark = j->used;
    const char *k;
    int rc = stj_string(j, &k, err);
    if (!rc) rc = stj_expect(j, ':', "':'", err);
    if (!rc) rc = stj_need(j, err);
    if (rc) return rc;
    if (!strcmp(k, "__metadata__")) {
        if (*have_meta) return stj_fail(j, at, err, "duplicate key \"__metadata__\"");
        *have_meta = 1;
        j->used = mark;
        return st_int_parse_metadata(j, f, err);
    }
    if ((rc = grow_tensors(r, 1, err))) return fsdp_err_prefix(err, "%s", f->path);
    st_tensor_info *t = &r->t[r->nt];
    memset(t, 0, sizeof *t);
    t->name = k;
    t->file = fidx;
    if ((rc = st_int_parse_entry(j, f, t, err))) return rc;
    r->nt++;
    return FSDP_OK;
}

/* The header's top-level object, its tensors appended to r. */
static int parse_object(st_reader *r, st_file *f, size_t fidx, stj *j, fsdp_err *err) {
    int c = stj_peek(j), rc = FSDP_OK, closed = 0, have_meta = 0;
    if (c == '[') return fsdp_err_set(err, FSDP_E_FORMAT, "%s: JSON header is not an object", f->path);
    if ((rc = stj_expect(j, '{', "'{'", err))) return rc;
    if (stj_peek(j) == '}') {
        j->pos++;
        closed = 1;
    }
    while (!closed) {
        if (stj_peek(j) != '"') return stj_fail(j, j->pos, err, "a tensor name (string) expected");
        if ((rc = parse_member(r, f, fidx, j, &have_meta, err))) return rc;
        if ((rc = stj_sep(j, '}', &closed, "after a tensor or __metadata__", NULL, err))) return rc;
    }
    if (stj_peek(j) >= 0) return stj_fail(j, j->pos, err, "the header's object is followed by more than whitespace");
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
    stj j;
    int rc = stj_init(&j, f->map + 8, (size_t)n, f->path, err);
    if (rc) return rc;
    f->strs = j.arena; /* freed by st_close, whatever happens */
    f->t0 = r->nt;
    rc = parse_object(r, f, fidx, &j, err);
    f->nt = r->nt - f->t0;
    if (!rc && f->nt) rc = sort_by_offset(r->t + f->t0, f->nt, f->path, err);
    /* nothing points into the header text any more (names and metadata are in the arena): its
     * whole pages leave the resident set (they would be read back from the file if touched) */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), whole = (size_t)f->data_start / pg * pg;
    if (whole) madvise(f->map, whole, MADV_DONTNEED);
    return rc;
}

int st_int_add_file(st_reader *r, const char *path, const char *rel, fsdp_err *err) {
    st_file *fs = (st_file *)realloc(r->files, (r->nfiles + 1) * sizeof *fs);
    if (!fs) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    r->files = fs;
    st_file *f = &fs[r->nfiles];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    r->nfiles++; /* from here on st_close frees whatever f holds */
    f->path = strdup(path);
    if (!f->path) return fsdp_err_set(err, FSDP_E_NOMEM, "%s: out of memory", path);
    int rc = map_file(r, f, rel, err);
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
        if (strcmp(a->name, b->name)) continue;
        if (a->file == b->file)
            return fsdp_err_set(err, FSDP_E_FORMAT, "%s: duplicate tensor '%s' in the header",
                                r->files[a->file].path, a->name);
        return fsdp_err_set(err, FSDP_E_FORMAT, "duplicate tensor '%s': in %s and in %s", a->name,
                            r->files[a->file].path, r->files[b->file].path);
    }
    for (size_t k = 0; k < r->nfiles; k++) {
        int rc = check_tiling(&r->files[k], r->files[k].nt ? r->t + r->files[k].t0 : NULL, err);
        if (rc) return rc;
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
