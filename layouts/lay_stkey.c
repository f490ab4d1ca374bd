/* OLMo's safetensors twins (olmo/safetensors_util.py; layouts/layout.h lay_stkey_*): every entry of a nested state
 * dict is one safetensors tensor whose name is base64url(pickle((keys, value_is_pickled))), keys the tuple of dict keys
 * down to it; a value that is not a tensor or a dict (OLMo's optim param_groups list, a number) is a uint8 tensor
 * holding its pickle. The url-safe base64 here is the RFC 4648 alphabet of Python's base64.urlsafe_b64encode (a few
 * lines; no library the project links has it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/pickle.h"
#include "ckpt/reader_view.h"
#include "layouts/lay_stkey.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static int b64_val(int c) {
    const char *p = c ? strchr(B64, c) : NULL;
    return p ? (int)(p - B64) : -1;
}

/* base64url text -> bytes (malloc'd); -1 when it is not base64url */
static int b64_decode(const char *s, unsigned char **out, size_t *n) {
    size_t len = strlen(s), k = 0;
    unsigned char *o = malloc(len / 4 * 3 + 3);
    if (!o) return -1;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '=') break;
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) return free(o), -1;
        acc = (acc << 6) | (unsigned)v, bits += 6;
        if (bits >= 8) bits -= 8, o[k++] = (unsigned char)(acc >> bits);
    }
    *out = o, *n = k;
    return 0;
}

int lay_stkey_encode(const void *pickle, size_t n, char *out, size_t cap) {
    const unsigned char *p = pickle;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        if (k + 5 > cap) return -1;
        out[k++] = B64[v >> 18 & 63], out[k++] = B64[v >> 12 & 63];
        out[k++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        out[k++] = i + 2 < n ? B64[v & 63] : '=';
    }
    out[k] = '\0';
    return 0;
}

/* Python 3's pickle.dumps((keys, pickled)) byte for byte (protocol 4: one frame, short strings, each string and
 * tuple memoized), what encode_key pickles; keys of up to 3 components (OLMo's are 1 to 3) as TUPLE1..3. */
static int key_pickle(const char *const *keys, size_t n, int pickled, unsigned char *out, size_t cap, size_t *len) {
    size_t k = 11; /* PROTO 4, FRAME <8 bytes> */
    if (n < 1 || n > 3) return -1;
    for (size_t i = 0; i < n; i++) {
        size_t m = strlen(keys[i]);
        if (k + m + 8 > cap) return -1;
        if (m < 256) out[k++] = 0x8c, out[k++] = (unsigned char)m; /* SHORT_BINUNICODE */
        else {
            out[k++] = 'X'; /* BINUNICODE */
            for (int b = 0; b < 4; b++) out[k++] = (unsigned char)(m >> (8 * b));
        }
        memcpy(out + k, keys[i], m), k += m;
        out[k++] = 0x94; /* MEMOIZE */
    }
    if (k + 6 > cap) return -1;
    out[k++] = (unsigned char)(0x84 + n), out[k++] = 0x94; /* TUPLEn, MEMOIZE */
    out[k++] = pickled ? 0x88 : 0x89;                      /* NEWTRUE / NEWFALSE */
    out[k++] = 0x86, out[k++] = 0x94, out[k++] = '.';      /* TUPLE2, MEMOIZE, STOP */
    uint64_t frame = k - 11;
    out[0] = 0x80, out[1] = 4, out[2] = 0x95;
    for (int b = 0; b < 8; b++) out[3 + b] = (unsigned char)(frame >> (8 * b));
    *len = k;
    return 0;
}

int lay_stkey_name(const char *const *keys, size_t n, int pickled, char *out, size_t cap) {
    unsigned char p[LAY_STKEY_NAME];
    size_t len;
    return key_pickle(keys, n, pickled, p, sizeof p, &len) ? -1 : lay_stkey_encode(p, len, out, cap);
}

int lay_stkey_decode(const char *enc, char *dotted, size_t cap, int *pickled, fsdp_err *err) {
    unsigned char *b;
    size_t n;
    if (b64_decode(enc, &b, &n)) return fsdp_err_set(err, FSDP_E_FORMAT, "key %.80s is not OLMo's (base64url)", enc);
    pkl_doc *doc;
    const pkl_obj *root;
    int rc = pkl_parse(b, n, enc, &doc, &root, err);
    free(b);
    if (rc) return rc;
    const pkl_obj *keys = root->kind == PKL_TUPLE && root->n == 2 ? root->items[0] : NULL;
    const pkl_obj *flag = keys ? root->items[1] : NULL;
    rc = keys && keys->kind == PKL_TUPLE && keys->n && flag->kind == PKL_BOOL
             ? 0 : fsdp_err_set(err, FSDP_E_FORMAT, "key %.80s: expected OLMo's (keys, value_is_pickled)", enc);
    size_t at = 0;
    for (size_t k = 0; k < (keys ? keys->n : 0) && !rc; k++) {
        const pkl_obj *o = keys->items[k];
        int m = o->kind == PKL_STR ? snprintf(dotted + at, cap - at, "%s%s", k ? "." : "", o->s)
              : o->kind == PKL_INT ? snprintf(dotted + at, cap - at, "%s%lld", k ? "." : "", (long long)o->i) : -1;
        if (m < 0 || (size_t)m >= cap - at) rc = fsdp_err_set(err, FSDP_E_FORMAT, "key %.80s: a key too long or not "
                                                               "a str / int", enc);
        else at += (size_t)m;
    }
    if (!rc) *pickled = (int)flag->i;
    pkl_free(doc);
    return rc;
}

/* A pickled value under name into the view: dicts flattened (name.key), a list of dicts by index, the rest a value. */
static int add_flat(ckv_builder *b, const char *name, const pkl_obj *o, fsdp_err *err) {
    char sub[LAY_STKEY_NAME];
    int dicts = o->kind == PKL_LIST && o->n > 0;
    for (size_t k = 0; dicts && k < o->n; k++) dicts &= o->items[k]->kind == PKL_DICT;
    if (o->kind == PKL_DICT || dicts) {
        int rc = 0;
        for (size_t k = 0; k < o->n && !rc; k++) {
            const pkl_obj *key = o->kind == PKL_DICT ? o->items[2 * k] : NULL;
            const pkl_obj *val = o->kind == PKL_DICT ? o->items[2 * k + 1] : o->items[k];
            if (key && key->kind == PKL_STR) snprintf(sub, sizeof sub, "%s.%s", name, key->s);
            else if (key && key->kind == PKL_INT) snprintf(sub, sizeof sub, "%s.%lld", name, (long long)key->i);
            else if (!key) snprintf(sub, sizeof sub, "%s.%zu", name, k);
            else return fsdp_err_set(err, FSDP_E_FORMAT, "%s: a dict key that is no str or int", name);
            rc = add_flat(b, sub, val, err);
        }
        return rc;
    }
    pkl_w w;
    pkl_w_init(&w);
    int rc = pkl_w_obj(&w, o, 1u << 20) ? fsdp_err_set(err, FSDP_E_FORMAT, "%s: a value fsdp-run cannot keep", name) : 0;
    char *text = rc ? NULL : pkl_repr(o);
    if (!rc) rc = w.oom || !text ? fsdp_err_set(err, FSDP_E_NOMEM, "out of memory") : ckv_add_value(b, name, w.buf, w.len, text, err);
    free(text);
    pkl_w_free(&w);
    return rc;
}

/* Entry i of r, a uint8 tensor holding a pickle, flattened into b under name. */
static int add_pickled(ckv_builder *b, ckpt_reader *r, size_t i, const char *name, fsdp_err *err) {
    const ckpt_entry *e = ckpt_entry_at(r, i);
    if (e->dtype != FSDP_DT_U8 || e->ndim != 1)
        return fsdp_err_set(err, FSDP_E_FORMAT, "%s: %s holds a pickled value, and is no 1-d uint8 tensor", ckpt_reader_path(r),
                            name);
    unsigned char *buf = malloc((size_t)e->shape[0] + 1);
    if (!buf) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    int rc = ckpt_read_rows(r, i, 0, e->shape[0], buf, FSDP_DT_U8, err);
    pkl_doc *doc = NULL;
    const pkl_obj *root;
    if (!rc) rc = pkl_parse(buf, (size_t)e->shape[0], name, &doc, &root, err);
    if (!rc) rc = add_flat(b, name, root, err);
    pkl_free(doc);
    free(buf);
    return rc;
}

int lay_stkey_open(const char *path, ckpt_reader **out, fsdp_err *err) {
    ckpt_reader *r;
    int rc = ckpt_open(path, CKPT_SAFETENSORS, &r, err);
    if (rc) return rc;
    ckv_builder *b;
    if ((rc = ckv_new(r, 1, &b, err))) return rc;
    for (size_t i = 0; i < ckpt_count(r) && !rc; i++) {
        char name[LAY_STKEY_NAME];
        int pickled;
        if ((rc = lay_stkey_decode(ckpt_entry_at(r, i)->name, name, sizeof name, &pickled, err))) break;
        rc = pickled ? add_pickled(b, r, i, name, err) : ckv_add_same(b, name, i, err);
    }
    if (rc) {
        ckv_free(b);
        return fsdp_err_prefix(err, "%s", path);
    }
    return ckv_finish(b, out, err);
}
