/* Safetensors-serialized DCP pieces (see dcp_st.h). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_pio.h"
#include "ckpt/dcp_st.h"
#include "ckpt/safetensors.h"
#include "runtime/checked.h"

struct dcp_st_blob {
    uint64_t at;         /* blob start in the file */
    uint64_t data_start; /* absolute offset of its byte buffer */
    json_t *root;        /* the header */
    json_t *sharding;    /* DCP_SHARDING_INFO parsed, or NULL */
};

int dcp_st_is_piece(int fd, uint64_t off) {
    unsigned char h[9];
    if (pread(fd, h, sizeof h, (off_t)off) != (ssize_t)sizeof h) return 0;
    return !(h[0] == 'P' && h[1] == 'K') && h[8] == '{';
}

void dcp_st_blob_free(dcp_st_blob *b) {
    if (!b) return;
    json_decref(b->root);
    json_decref(b->sharding);
    free(b);
}

static int parse_blob(int fd, uint64_t fsize, uint64_t off, const char *what, dcp_st_blob **out, fsdp_err *err) {
    unsigned char h[8];
    if (off > fsize || fsize - off < 8 || pread(fd, h, 8, (off_t)off) != 8)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: safetensors piece at byte %llu: truncated header length", what,
                            (unsigned long long)off);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | h[i];
    if (n > ST_MAX_HEADER_SIZE || n > fsize - off - 8)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: safetensors piece at byte %llu: header length %llu runs past the end of the file",
                            what, (unsigned long long)off, (unsigned long long)n);
    char *js = malloc(n ? n : 1);
    if (!js) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", what);
    int rc = ckpt_pread_all(fd, js, n, off + 8, what, NULL, err);
    json_error_t je;
    json_t *root = rc ? NULL : json_loadb(js, n, JSON_REJECT_DUPLICATES, &je);
    free(js);
    if (rc) return rc;
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: safetensors piece at byte %llu: the header is not a JSON object",
                            what, (unsigned long long)off);
    }
    dcp_st_blob *b = calloc(1, sizeof *b);
    if (!b) {
        json_decref(root);
        return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    }
    b->at = off;
    b->data_start = off + 8 + n;
    b->root = root;
    const char *si = json_string_value(json_object_get(json_object_get(root, "__metadata__"), "DCP_SHARDING_INFO"));
    if (si) b->sharding = json_loads(si, JSON_REJECT_DUPLICATES, &je);
    *out = b;
    return 0;
}

static int get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* The entry of fqn checked: dtype, shape, [begin, end) of the right size inside the file. */
static int read_entry(const dcp_st_blob *b, uint64_t fsize, const char *fqn, const char *what, dcp_st_tensor *t,
                      fsdp_err *err) {
    const json_t *e = json_object_get(b->root, fqn);
    if (!e)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: the safetensors piece at byte %llu has no tensor %s", what,
                            (unsigned long long)b->at, fqn);
    const json_t *sh = json_object_get(e, "shape"), *of = json_object_get(e, "data_offsets");
    memset(t, 0, sizeof *t);
    t->dtype = st_dtype_parse(json_string_value(json_object_get(e, "dtype")) ? json_string_value(json_object_get(e, "dtype")) : "");
    uint64_t beg = 0, end = 0, d = 0;
    int bad = !t->dtype || !json_is_array(sh) || json_array_size(sh) > FSDP_MAX_DIMS || !json_is_array(of) ||
              json_array_size(of) != 2 || get_u64(json_array_get(of, 0), &beg) || get_u64(json_array_get(of, 1), &end);
    for (size_t i = 0; !bad && i < json_array_size(sh); i++) {
        bad = get_u64(json_array_get(sh, i), &d) || d > (uint64_t)INT64_MAX;
        t->shape[i] = (int64_t)d;
    }
    if (bad)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: safetensors piece: tensor %s: bad dtype, shape or data_offsets", what,
                            fqn);
    t->ndim = (int)json_array_size(sh);
    int64_t nb;
    if (chk_shape_bytes(t->ndim, t->shape, fsdp_dtype_size(t->dtype), &nb) || end < beg || end - beg != (uint64_t)nb ||
        end > fsize - b->data_start)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: corrupt safetensors piece: tensor %s: data_offsets [%llu, %llu) do not hold its %s "
                            "bytes inside the file",
                            what, fqn, (unsigned long long)beg, (unsigned long long)end,
                            fsdp_dtype_name(t->dtype));
    t->at = b->data_start + beg;
    return 0;
}

int dcp_st_locate(dcp_st_blob **cache, int fd, uint64_t fsize, uint64_t off, const char *fqn, int ndim,
                  const int64_t *chunk_offsets, const char *what, dcp_st_tensor *t, fsdp_err *err) {
    if (!*cache || (*cache)->at != off) {
        dcp_st_blob *b;
        int rc = parse_blob(fd, fsize, off, what, &b, err);
        if (rc) return rc;
        dcp_st_blob_free(*cache);
        *cache = b;
    }
    int rc = read_entry(*cache, fsize, fqn, what, t, err);
    if (rc) return rc;
    const json_t *so = json_object_get(json_object_get((*cache)->sharding, fqn), "saved_offsets");
    if (!so) return 0;
    int same = json_is_array(so) && json_array_size(so) == (size_t)ndim;
    for (int d = 0; same && d < ndim; d++)
        same = json_is_integer(json_array_get(so, (size_t)d)) &&
               json_integer_value(json_array_get(so, (size_t)d)) == chunk_offsets[d];
    if (!same)
        return fsdp_err_set(err, FSDP_E_FORMAT,
                            "%s: tensor %s: the piece's DCP_SHARDING_INFO saved_offsets are not the chunk's offsets in "
                            ".metadata",
                            what, fqn);
    return 0;
}

int dcp_st_read_box(int fd, const dcp_st_tensor *t, const int64_t *off, const int64_t *len, void *dst,
                    fsdp_dtype dst_dt, const char *what, fsdp_err *err) {
    int nd = t->ndim;
    size_t esz = fsdp_dtype_size(t->dtype);
    int64_t n = 1, stride[FSDP_MAX_DIMS], st = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (off[d] < 0 || len[d] < 0 || off[d] > t->shape[d] || len[d] > t->shape[d] - off[d])
            return fsdp_err_set(err, FSDP_E_INVALID, "%s: box outside the stored piece", what);
        stride[d] = st;
        st *= t->shape[d];
        n *= len[d];
    }
    if (n == 0) return 0;
    /* the innermost run: the trailing dims the box covers whole, times the box's extent of the next */
    int k = nd - 1;
    int64_t run = nd ? len[nd - 1] : 1;
    while (k > 0 && len[k] == t->shape[k]) run *= len[--k];
    void *tmp = dst_dt == t->dtype ? dst : malloc((size_t)n * esz);
    if (!tmp) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory reading %s", what);
    int64_t idx[FSDP_MAX_DIMS] = {0};
    int rc = 0;
    for (int64_t done = 0; done < n && !rc; done += run) {
        int64_t e = 0;
        for (int d = 0; d < nd; d++) e += (off[d] + (d < k ? idx[d] : 0)) * stride[d];
        rc = ckpt_pread_all(fd, (char *)tmp + (size_t)done * esz, (size_t)run * esz, t->at + (uint64_t)e * esz, what,
                            NULL, err);
        for (int d = k - 1; d >= 0; d--) {
            if (++idx[d] < len[d]) break;
            idx[d] = 0;
        }
    }
    if (!rc && tmp != dst) rc = ckpt_convert_par(dst, dst_dt, tmp, t->dtype, (size_t)n, NULL, err);
    if (tmp != dst) free(tmp);
    return rc;
}
