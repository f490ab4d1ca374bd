/* Pickle writer: protocol-2 opcodes for DCP `.metadata` and torch.save `data.pkl`. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "ckpt/pickle.h"
#include "fsdp/tensor.h"

/* The memo: "s<string>" / "g<module>\n<name>" / "z<dims>" -> memo index: keys[i] is entry i's key (owned
 * here), slots an open-addressing hash table of entry + 1 (0: free), at most half full. */
struct pkl_w_memo {
    char **keys;
    size_t n, cap;
    uint32_t *slots;
    size_t nslots;
};

static size_t key_hash(const char *k) {
    uint64_t h = 1469598103934665603ull;
    for (; *k; k++) h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

/* the slot holding key, or the free slot where it goes */
static size_t memo_slot(const struct pkl_w_memo *m, const char *key) {
    size_t h = key_hash(key) & (m->nslots - 1);
    while (m->slots[h] && strcmp(m->keys[m->slots[h] - 1], key)) h = (h + 1) & (m->nslots - 1);
    return h;
}

/* room for one more entry (keys and a table at most half full); 0, or -1 when out of memory */
static int memo_room(struct pkl_w_memo *m) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        char **nk = realloc(m->keys, cap * sizeof *nk);
        if (!nk) return -1;
        m->keys = nk, m->cap = cap;
    }
    if (2 * (m->n + 1) <= m->nslots) return 0;
    size_t ns = m->nslots ? m->nslots * 2 : 256;
    uint32_t *old = m->slots, *t = calloc(ns, sizeof *t);
    if (!t || m->n >= UINT32_MAX) {
        free(t);
        return -1;
    }
    m->slots = t, m->nslots = ns;
    for (size_t i = 0; i < m->n; i++) m->slots[memo_slot(m, m->keys[i])] = (uint32_t)(i + 1);
    free(old);
    return 0;
}

void pkl_w_init(pkl_w *w) { memset(w, 0, sizeof *w); }
void pkl_w_free(pkl_w *w) {
    free(w->buf);
    if (w->memo) {
        for (size_t i = 0; i < w->memo->n; i++) free(w->memo->keys[i]);
        free(w->memo->keys);
        free(w->memo->slots);
        free(w->memo);
    }
    memset(w, 0, sizeof *w);
}

int pkl_w_memo_on(pkl_w *w) {
    if (!w->memo) w->memo = calloc(1, sizeof *w->memo);
    return w->memo ? 0 : -1;
}

static void put(pkl_w *w, const void *p, size_t n) {
    if (w->oom) return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        while (cap < w->len + n) cap *= 2;
        unsigned char *nb = realloc(w->buf, cap);
        if (!nb) {
            w->oom = 1;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}
static void op(pkl_w *w, unsigned char c) { put(w, &c, 1); }
static void le(pkl_w *w, uint64_t x, int n) {
    unsigned char b[8];
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(x >> (8 * i));
    put(w, b, (size_t)n);
}

void pkl_w_proto(pkl_w *w, int proto) {
    op(w, 0x80);
    op(w, (unsigned char)proto);
}
void pkl_w_stop(pkl_w *w) { op(w, '.'); }
void pkl_w_mark(pkl_w *w) { op(w, '('); }
void pkl_w_none(pkl_w *w) { op(w, 'N'); }
void pkl_w_bool(pkl_w *w, int v) { op(w, v ? 0x88 : 0x89); }

void pkl_w_int(pkl_w *w, int64_t v) {
    if (v >= 0 && v < 256) {
        op(w, 'K');
        le(w, (uint64_t)v, 1);
    } else if (v >= 0 && v < 65536) {
        op(w, 'M');
        le(w, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(w, 'J');
        le(w, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else {
        /* LONG1: minimal little-endian two's complement */
        unsigned char b[9];
        int n = 0;
        int64_t x = v;
        for (;;) {
            b[n++] = (unsigned char)(x & 0xff);
            int64_t rest = x >> 8; /* arithmetic shift */
            int sign = (b[n - 1] & 0x80) != 0;
            if ((rest == 0 && !sign) || (rest == -1 && sign) || n == 8) break;
            x = rest;
        }
        op(w, 0x8a);
        op(w, (unsigned char)n);
        put(w, b, (size_t)n);
    }
}

void pkl_w_float(pkl_w *w, double v) {
    uint64_t x;
    memcpy(&x, &v, 8);
    op(w, 'G');
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(x >> (8 * (7 - i)));
    put(w, b, 8);
}

/* With a memo: 1 when key was written before (its BINGET written now); else 0, and *slot is the memo index
 * the caller's value gets (-1: not memoized, e.g. out of memory: written plainly). */
static int memo_get(pkl_w *w, const char *tag, const char *a, const char *b, long *slot) {
    *slot = -1;
    struct pkl_w_memo *m = w->memo;
    if (!m || w->oom) return 0;
    size_t la = strlen(a), lb = b ? strlen(b) : 0, need = la + lb + 3;
    char small[1200], *key = need <= sizeof small ? small : malloc(need); /* looked up without a copy */
    if (!key) return 0;
    memcpy(key, tag, 1);
    memcpy(key + 1, a, la);
    if (b) key[1 + la] = '\n', memcpy(key + 2 + la, b, lb);
    key[1 + la + (b ? lb + 1 : 0)] = 0;
    size_t h = m->nslots ? memo_slot(m, key) : 0;
    if (m->nslots && m->slots[h]) {
        if (key != small) free(key);
        uint64_t at = m->slots[h] - 1;
        if (at < 256) op(w, 'h'), le(w, at, 1); /* BINGET */
        else op(w, 'j'), le(w, at, 4);          /* LONG_BINGET */
        return 1;
    }
    char *own = memo_room(m) ? NULL : key == small ? strdup(small) : key;
    if (!own) { /* out of memory: written plainly */
        if (key != small) free(key);
        return 0;
    }
    m->keys[m->n] = own;
    m->slots[memo_slot(m, own)] = (uint32_t)(m->n + 1);
    *slot = (long)m->n++;
    return 0;
}

/* BINPUT / LONG_BINPUT of the value just written into memo slot (none for -1) */
static void memo_put(pkl_w *w, long slot) {
    if (slot < 0) return;
    if (slot < 256) op(w, 'q'), le(w, (uint64_t)slot, 1);
    else op(w, 'r'), le(w, (uint64_t)slot, 4);
}

void pkl_w_str(pkl_w *w, const char *s) {
    long slot;
    if (memo_get(w, "s", s, NULL, &slot)) return;
    size_t n = strlen(s);
    op(w, 'X');
    le(w, n, 4);
    put(w, s, n);
    memo_put(w, slot);
}

void pkl_w_global(pkl_w *w, const char *module, const char *name) {
    long slot;
    if (memo_get(w, "g", module, name, &slot)) return;
    op(w, 'c');
    put(w, module, strlen(module));
    op(w, '\n');
    put(w, name, strlen(name));
    op(w, '\n');
    memo_put(w, slot);
}

void pkl_w_empty_tuple(pkl_w *w) { op(w, ')'); }
void pkl_w_tuple(pkl_w *w) { op(w, 't'); }
void pkl_w_tuple_n(pkl_w *w, int n) { op(w, (unsigned char)(0x84 + n)); }
void pkl_w_empty_list(pkl_w *w) { op(w, ']'); }
void pkl_w_appends(pkl_w *w) { op(w, 'e'); }
void pkl_w_empty_dict(pkl_w *w) { op(w, '}'); }
void pkl_w_setitems(pkl_w *w) { op(w, 'u'); }
void pkl_w_reduce(pkl_w *w) { op(w, 'R'); }
void pkl_w_newobj(pkl_w *w) { op(w, 0x81); }
void pkl_w_build(pkl_w *w) { op(w, 'b'); }
void pkl_w_binpersid(pkl_w *w) { op(w, 'Q'); }

void pkl_w_int_tuple(pkl_w *w, const int64_t *d, int n) {
    if (n == 0) {
        pkl_w_empty_tuple(w);
        return;
    }
    if (n > 3) pkl_w_mark(w);
    for (int i = 0; i < n; i++) pkl_w_int(w, d[i]);
    if (n > 3) pkl_w_tuple(w);
    else pkl_w_tuple_n(w, n);
}

void pkl_w_size(pkl_w *w, const int64_t *d, int n) {
    /* with a memo, each distinct size once (a torch.Size is immutable: sharing it changes nothing) */
    char key[FSDP_MAX_DIMS * 21 + 1];
    size_t k = 0;
    for (int i = 0; i < n && n <= FSDP_MAX_DIMS; i++) k += (size_t)snprintf(key + k, sizeof key - k, "%lld,", (long long)d[i]);
    key[k] = 0;
    long slot = -1;
    if (n <= FSDP_MAX_DIMS && memo_get(w, "z", key, NULL, &slot)) return;
    pkl_w_global(w, "torch", "Size");
    pkl_w_int_tuple(w, d, n);
    pkl_w_tuple_n(w, 1);
    pkl_w_reduce(w);
    memo_put(w, slot);
}

void pkl_w_bytes(pkl_w *w, const void *b, size_t n) {
    /* protocol 2 has no bytes opcodes: _codecs.encode(<latin-1 text>, 'latin1'), as Python writes it */
    unsigned char *t = malloc(2 * n + 1);
    if (!t) {
        w->oom = 1;
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = ((const unsigned char *)b)[i];
        if (c < 0x80) t[k++] = c;
        else t[k++] = (unsigned char)(0xc0 | (c >> 6)), t[k++] = (unsigned char)(0x80 | (c & 0x3f));
    }
    pkl_w_global(w, "_codecs", "encode");
    op(w, 'X');
    le(w, k, 4);
    put(w, t, k);
    pkl_w_str(w, "latin1");
    pkl_w_tuple_n(w, 2);
    pkl_w_reduce(w);
    free(t);
}

/* One node of pkl_w_obj; -1 when the tree cannot be written (a persistent id: storage) or holds
 * more than *budget nodes. */
static int w_obj(pkl_w *w, const pkl_obj *o, size_t *budget) {
    if (*budget == 0) return -1;
    --*budget;
    int rc = 0;
    switch (o->kind) {
    case PKL_NONE: pkl_w_none(w); break;
    case PKL_BOOL: pkl_w_bool(w, (int)o->i); break;
    case PKL_INT: pkl_w_int(w, o->i); break;
    case PKL_BIGINT:
        if (o->len < 256) op(w, 0x8a), le(w, o->len, 1);
        else op(w, 0x8b), le(w, o->len, 4);
        put(w, o->s, o->len);
        break;
    case PKL_FLOAT: pkl_w_float(w, o->f); break;
    case PKL_STR:
        op(w, 'X');
        le(w, o->len, 4);
        put(w, o->s, o->len);
        break;
    case PKL_BYTES: pkl_w_bytes(w, o->s, o->len); break;
    case PKL_TUPLE:
        op(w, '(');
        for (size_t i = 0; i < o->n && !rc; i++) rc = w_obj(w, o->items[i], budget);
        op(w, 't');
        break;
    case PKL_LIST:
        op(w, ']');
        if (o->n) op(w, '(');
        for (size_t i = 0; i < o->n && !rc; i++) rc = w_obj(w, o->items[i], budget);
        if (o->n) op(w, 'e');
        break;
    case PKL_DICT:
        if (o->fn && o->args) { /* an OrderedDict (REDUCE, then SETITEMS made it a dict) */
            if (!(rc = w_obj(w, o->fn, budget))) rc = w_obj(w, o->args, budget);
            op(w, 'R');
        } else {
            op(w, '}');
        }
        if (o->n) op(w, '(');
        for (size_t i = 0; i < 2 * o->n && !rc; i++) rc = w_obj(w, o->items[i], budget);
        if (o->n) op(w, 'u');
        break;
    case PKL_GLOBAL: pkl_w_global(w, o->s, o->name); break;
    case PKL_REDUCE:
    case PKL_OBJ:
        if (!o->fn || !o->args) return -1;
        if (!(rc = w_obj(w, o->fn, budget))) rc = w_obj(w, o->args, budget);
        op(w, o->kind == PKL_REDUCE ? 'R' : 0x81);
        break;
    default: return -1; /* a persistent id (a storage), or MARK */
    }
    if (!rc && o->state && (o->kind == PKL_REDUCE || o->kind == PKL_OBJ || o->kind == PKL_DICT)) {
        rc = w_obj(w, o->state, budget);
        op(w, 'b');
    }
    return rc;
}

int pkl_w_value(pkl_w *w, const pkl_obj *o, size_t budget) { return w_obj(w, o, &budget); }

int pkl_w_obj(pkl_w *w, const pkl_obj *o, size_t budget) {
    pkl_w_proto(w, 2);
    int rc = w_obj(w, o, &budget);
    pkl_w_stop(w);
    return rc;
}
